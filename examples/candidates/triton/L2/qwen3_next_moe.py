"""Qwen3NextSparseMoeBlock from this tree's modules: routed experts plus the shared expert (this
tree's LlamaMLP) scaled by the per-token sigmoid gate; the sum is formed in float32 and rounded once."""
import torch
from torch import nn

from ..L1.linear import ReplicatedLinear
from ._experts import FusedMoE
from .llama_mlp import LlamaMLP


class Qwen3NextSparseMoeBlock(nn.Module):
    def __init__(self, hidden_size, moe_intermediate_size, num_experts, num_experts_per_tok, norm_topk_prob=True,
                 shared_expert_intermediate_size=0):
        super().__init__()
        self.gate = ReplicatedLinear(hidden_size, num_experts, bias=False)
        self.experts = FusedMoE(num_experts, num_experts_per_tok, hidden_size, moe_intermediate_size,
                                renormalize=norm_topk_prob)
        self.shared_expert = LlamaMLP(hidden_size, shared_expert_intermediate_size)
        self.shared_expert_gate = ReplicatedLinear(hidden_size, 1, bias=False)

    def forward(self, hidden_states):
        out = self.experts(hidden_states, self.gate(hidden_states)).float()
        gate = torch.sigmoid(self.shared_expert_gate(hidden_states).float())
        return (out + gate * self.shared_expert(hidden_states).float()).to(hidden_states.dtype)
