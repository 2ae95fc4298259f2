"""Qwen3MoeSparseMoeBlock (vLLM): Qwen3-MoE's router and routed experts (no shared expert).

``Qwen3MoeSparseMoeBlock(hidden_size, moe_intermediate_size, num_experts, num_experts_per_tok,
norm_topk_prob)``; ``forward(hidden_states[T, H]) -> [T, H]``. As Mixtral's block, but the k
routing weights are renormalised only with ``norm_topk_prob`` (True in Qwen3-30B-A3B's config).
Checkpoint names: ``mlp.gate``, ``mlp.experts.{e}.gate_proj/up_proj/down_proj``.
"""
import torch
from torch import nn

from ..L1.fused_moe import FusedMoE
from ..L1.linear import ReplicatedLinear
from ..native import run
from ..records import RecordsInit


class Qwen3MoeSparseMoeBlock(RecordsInit, nn.Module):
    def __init__(self, hidden_size: int, moe_intermediate_size: int, num_experts: int,
                 num_experts_per_tok: int, norm_topk_prob: bool = True):
        super().__init__()
        self.gate = ReplicatedLinear(hidden_size, num_experts, bias=False)
        self.experts = FusedMoE(num_experts, num_experts_per_tok, hidden_size, moe_intermediate_size,
                                renormalize=norm_topk_prob)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._forward(hidden_states, native=False)

    def forward_native(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._forward(hidden_states, native=True)

    def _forward(self, hidden_states, native):
        router_logits = run(self.gate, native, hidden_states)
        return run(self.experts, native, hidden_states, router_logits)
