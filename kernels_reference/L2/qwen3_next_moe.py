"""Qwen3NextSparseMoeBlock (vLLM): Qwen3-Next's MoE layer: routed experts plus one shared expert
whose output is scaled per token by a learned sigmoid gate.

``Qwen3NextSparseMoeBlock(hidden_size, moe_intermediate_size, num_experts, num_experts_per_tok,
norm_topk_prob, shared_expert_intermediate_size)``; ``forward(hidden_states[T, H]) -> [T, H]``:

    experts(x, gate(x)) + sigmoid(shared_expert_gate(x)) * shared_expert(x)

The router is the softmax over all experts and the top-k, renormalised with ``norm_topk_prob``
(True in Qwen3-Next-80B-A3B: 512 experts, 10 per token). ``shared_expert_gate`` is a [1, H]
projection: one scalar gate per token. The gate, its product and the sum are formed in the compute
dtype (float32 for half types) and rounded once. Checkpoint names: ``mlp.gate``,
``mlp.experts.{e}.gate_proj/up_proj/down_proj``, ``mlp.shared_expert.gate_proj/up_proj/down_proj``,
``mlp.shared_expert_gate``.
"""
import torch
from torch import nn

from ..dispatch import compute_dtype
from ..L1.fused_moe import FusedMoE
from ..L1.linear import ReplicatedLinear
from ..native import run
from ..records import RecordsInit
from .llama_mlp import LlamaMLP


class Qwen3NextSparseMoeBlock(RecordsInit, nn.Module):
    def __init__(self, hidden_size: int, moe_intermediate_size: int, num_experts: int,
                 num_experts_per_tok: int, norm_topk_prob: bool = True, shared_expert_intermediate_size: int = 0):
        super().__init__()
        self.gate = ReplicatedLinear(hidden_size, num_experts, bias=False)
        self.experts = FusedMoE(num_experts, num_experts_per_tok, hidden_size, moe_intermediate_size,
                                renormalize=norm_topk_prob)
        self.shared_expert = LlamaMLP(hidden_size, shared_expert_intermediate_size) \
            if shared_expert_intermediate_size else None
        self.shared_expert_gate = ReplicatedLinear(hidden_size, 1, bias=False) \
            if shared_expert_intermediate_size else None

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._forward(hidden_states, native=False)

    def forward_native(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._forward(hidden_states, native=True)

    def _forward(self, hidden_states, native):
        routed = run(self.experts, native, hidden_states, run(self.gate, native, hidden_states))
        if self.shared_expert is None:
            return routed
        shared = run(self.shared_expert, native, hidden_states)
        gate = run(self.shared_expert_gate, native, hidden_states)
        compute = compute_dtype(hidden_states.dtype)
        out = routed.to(compute) + torch.sigmoid(gate.to(compute)) * shared.to(compute)
        return out.to(hidden_states.dtype)
