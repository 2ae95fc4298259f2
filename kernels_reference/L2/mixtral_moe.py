"""MixtralMoE (vLLM): the router GEMM, then the routed experts.

``MixtralMoE(num_experts, top_k, hidden_size, intermediate_size)``; ``forward(hidden_states[T, H])
-> [T, H]``. ``gate`` (ReplicatedLinear H -> E, in the model dtype, as vLLM runs it) gives the
router logits; ``experts`` (FusedMoE, top-k of the softmax renormalised over the k) does the rest.
Mixtral's checkpoints call the block ``block_sparse_moe``; its experts are ``w1`` (gate), ``w3``
(up) and ``w2`` (down), stacked here into ``experts.w13_weight`` / ``experts.w2_weight``.
"""
import torch
from torch import nn

from ..L1.fused_moe import FusedMoE
from ..L1.linear import ReplicatedLinear
from ..native import run
from ..records import RecordsInit


class MixtralMoE(RecordsInit, nn.Module):
    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate = ReplicatedLinear(hidden_size, num_experts, bias=False)
        self.experts = FusedMoE(num_experts, top_k, hidden_size, intermediate_size, renormalize=True)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._forward(hidden_states, native=False)

    def forward_native(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._forward(hidden_states, native=True)

    def _forward(self, hidden_states, native):
        router_logits = run(self.gate, native, hidden_states)
        return run(self.experts, native, hidden_states, router_logits)
