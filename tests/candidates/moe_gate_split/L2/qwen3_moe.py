# HONEST L2 candidate whose router GEMM sums in another order: the hidden dimension in two halves,
# each rounded to the model dtype, then added (a split-K GEMM). Near-tied tokens may then pick
# another 8th expert than the reference: routing-aware correctness must still pass it.
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
        half = hidden_states.shape[1] // 2
        w = self.gate.weight
        logits = hidden_states[:, :half] @ w[:, :half].t() + hidden_states[:, half:] @ w[:, half:].t()
        return self.experts(hidden_states, logits)
