# WRONG L2 candidate: every token goes to the wrong experts (the router's logits are read for the
# next expert id, a rotation of the expert table). Routing-aware correctness must still fail it.
import torch
from torch import nn

from kernels_reference.L1.fused_moe import FusedMoE
from kernels_reference.L1.linear import ReplicatedLinear


class Qwen3MoeSparseMoeBlock(nn.Module):
    def __init__(self, hidden_size, moe_intermediate_size, num_experts, num_experts_per_tok, norm_topk_prob=True):
        super().__init__()
        self.gate = ReplicatedLinear(hidden_size, num_experts, bias=False)
        self.experts = FusedMoE(num_experts, num_experts_per_tok, hidden_size, moe_intermediate_size,
                                renormalize=norm_topk_prob)

    def forward(self, hidden_states):
        return self.experts(hidden_states, torch.roll(self.gate(hidden_states), 1, dims=-1))
