"""DeepseekV2MoE from this tree's modules: routed experts scaled by routed_scaling_factor plus the
shared experts (this tree's LlamaMLP); the sum is formed in float32 and rounded once."""
import torch
from torch import nn

from ..L1.linear import ReplicatedLinear
from ._experts import FusedMoE
from .llama_mlp import LlamaMLP


class DeepseekV2MoE(nn.Module):
    def __init__(self, hidden_size, moe_intermediate_size, n_routed_experts, num_experts_per_tok,
                 n_shared_experts, norm_topk_prob=False, routed_scaling_factor=1.0):
        super().__init__()
        self.scale = routed_scaling_factor
        self.gate = ReplicatedLinear(hidden_size, n_routed_experts, bias=False)
        self.experts = FusedMoE(n_routed_experts, num_experts_per_tok, hidden_size, moe_intermediate_size,
                                renormalize=norm_topk_prob)
        self.shared_experts = LlamaMLP(hidden_size, moe_intermediate_size * n_shared_experts) \
            if n_shared_experts else None

    def forward(self, hidden_states):
        out = self.experts(hidden_states, self.gate(hidden_states)).float() * self.scale
        if self.shared_experts is not None:
            out = out + self.shared_experts(hidden_states).float()
        return out.to(hidden_states.dtype)
