"""MixtralMoE from this tree's modules: the router GEMM (ReplicatedLinear) then the routed experts."""
from torch import nn

from ..L1.linear import ReplicatedLinear
from ._experts import FusedMoE


class MixtralMoE(nn.Module):
    def __init__(self, num_experts, top_k, hidden_size, intermediate_size):
        super().__init__()
        self.gate = ReplicatedLinear(hidden_size, num_experts, bias=False)
        self.experts = FusedMoE(num_experts, top_k, hidden_size, intermediate_size, renormalize=True)

    def forward(self, hidden_states):
        return self.experts(hidden_states, self.gate(hidden_states))
