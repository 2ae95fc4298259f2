"""DeepseekV2MoE (vLLM): routed experts plus always-on shared experts (DeepSeek-V2 / V2-Lite).

``DeepseekV2MoE(hidden_size, moe_intermediate_size, n_routed_experts, num_experts_per_tok,
n_shared_experts, norm_topk_prob, routed_scaling_factor)``; ``forward(hidden_states[T, H]) -> [T, H]``:

    routed_scaling_factor * experts(x, gate(x)) + shared_experts(x)

The router is the softmax over all experts and the greedy top-k (no renormalisation unless
``norm_topk_prob``); ``routed_scaling_factor`` scales the routed sum only, never the shared
experts (HF multiplies the k routing weights by it, which is the same sum; vLLM scales the routed
output, as here). ``shared_experts`` is one LlamaMLP ``n_shared_experts * moe_intermediate_size``
wide (checkpoint: ``mlp.shared_experts.gate_proj/up_proj/down_proj``).

HF transformers 5 drops ``norm_topk_prob`` for DeepSeek-V2 (it never renormalises); every
published V2 config has it False, where all three agree.
"""
import torch
from torch import nn

from ..dispatch import compute_dtype
from ..L1.fused_moe import FusedMoE
from ..L1.linear import ReplicatedLinear
from ..native import run
from ..records import RecordsInit
from .llama_mlp import LlamaMLP


class DeepseekV2MoE(RecordsInit, nn.Module):
    def __init__(self, hidden_size: int, moe_intermediate_size: int, n_routed_experts: int,
                 num_experts_per_tok: int, n_shared_experts: int, norm_topk_prob: bool = False,
                 routed_scaling_factor: float = 1.0):
        super().__init__()
        self.routed_scaling_factor = routed_scaling_factor
        self.gate = ReplicatedLinear(hidden_size, n_routed_experts, bias=False)
        self.experts = FusedMoE(n_routed_experts, num_experts_per_tok, hidden_size, moe_intermediate_size,
                                renormalize=norm_topk_prob)
        self.shared_experts = LlamaMLP(hidden_size, moe_intermediate_size * n_shared_experts) \
            if n_shared_experts else None

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._forward(hidden_states, native=False)

    def forward_native(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._forward(hidden_states, native=True)

    def _forward(self, hidden_states, native):
        router_logits = run(self.gate, native, hidden_states)
        routed = run(self.experts, native, hidden_states, router_logits)
        if self.shared_experts is None:
            return routed * self.routed_scaling_factor if self.routed_scaling_factor != 1.0 else routed
        shared = run(self.shared_experts, native, hidden_states)
        # One rounding of the sum: scale and add in the compute dtype (float32 for half types).
        compute = compute_dtype(hidden_states.dtype)
        out = routed.to(compute) * self.routed_scaling_factor + shared.to(compute)
        return out.to(hidden_states.dtype)
