"""TopKSoftmax: the router's gating step of a mixture-of-experts layer (vLLM's ``topk_softmax``
kernel behind ``fused_topk``).

``TopKSoftmax(top_k, renormalize)``; ``forward(gating_output[T, E]) -> (topk_weights[T, k] float32,
topk_ids[T, k] int32)``. Softmax over all E router logits in float32, then the k largest
probabilities in descending order; with ``renormalize`` (Mixtral, Qwen3-MoE) the k weights are
divided by their sum, without it (DeepSeek-V2) they stay softmax probabilities. Ties between equal
logits may be broken either way: the task draws tie-free logits, and ids are compared as sets.
"""
from typing import Tuple

import torch
from torch import nn

from ..records import RecordsInit


class TopKSoftmax(RecordsInit, nn.Module):
    def __init__(self, top_k: int, renormalize: bool = True):
        super().__init__()
        self.top_k, self.renormalize = top_k, renormalize

    def forward(self, gating_output: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.forward_native(gating_output)

    def forward_native(self, gating_output: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        compute = torch.float64 if gating_output.dtype == torch.float64 else torch.float32
        probs = torch.softmax(gating_output.to(compute), dim=-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, ids.to(torch.int32)
