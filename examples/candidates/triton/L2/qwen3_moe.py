"""Qwen3MoeSparseMoeBlock from this tree's modules: router GEMM, then the routed experts (the k
weights renormalised only with ``norm_topk_prob``)."""
from torch import nn

from ..L1.linear import ReplicatedLinear
from ._experts import FusedMoE


class Qwen3MoeSparseMoeBlock(nn.Module):
    def __init__(self, hidden_size, moe_intermediate_size, num_experts, num_experts_per_tok, norm_topk_prob=True):
        super().__init__()
        self.gate = ReplicatedLinear(hidden_size, num_experts, bias=False)
        self.experts = FusedMoE(num_experts, num_experts_per_tok, hidden_size, moe_intermediate_size,
                                renormalize=norm_topk_prob)

    def forward(self, hidden_states):
        return self.experts(hidden_states, self.gate(hidden_states))
