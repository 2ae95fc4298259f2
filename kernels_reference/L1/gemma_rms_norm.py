"""GemmaRMSNorm: RMSNorm whose weight is centred on zero, as vLLM's ``GemmaRMSNorm`` (Qwen3-Next's
input, post-attention, final and q/k norms; Gemma's).

``x / rms(x) * (1 + weight)``, computed in float32 (float64 for float64 inputs) and rounded once,
as vLLM's ``GemmaRMSNorm`` and HF's ``Qwen3NextRMSNorm`` compute it; ``weight`` is stored as the
checkpoint holds it (zero-centred). With ``residual`` the same fused-add contract as
:class:`~kernels_reference.L1.rms_norm.RMSNorm`: the sum formed in float32, returned rounded as the
new residual, and normalised. The fast path is RMSNorm's Triton kernel with the unit offset on.
"""
from typing import Optional, Tuple, Union

import torch
from torch import nn

from ..dispatch import compute_dtype, use_fast_path
from ..records import RecordsInit
from .rms_norm import rms_norm_rows, triton


class GemmaRMSNorm(RecordsInit, nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.hidden_size = hidden_size
        self.variance_epsilon = eps
        self.weight = nn.Parameter(torch.zeros(hidden_size))

    def forward(
        self, x: torch.Tensor, residual: Optional[torch.Tensor] = None
    ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        if triton is not None and use_fast_path(x, residual):
            return self.forward_triton(x, residual)
        return self.forward_native(x, residual)

    def forward_native(self, x, residual=None):
        orig_dtype = x.dtype
        x = x.to(compute_dtype(orig_dtype))
        if residual is not None:
            x = x + residual.to(x.dtype)
            residual = x.to(orig_dtype)
        scale = 1.0 + self.weight.to(x.dtype)
        x = (x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.variance_epsilon) * scale).to(orig_dtype)
        return x if residual is None else (x, residual)

    def forward_triton(self, x, residual=None):
        return rms_norm_rows(self, x, residual, unit_offset=True)

    @torch.no_grad()
    def init_random_parameters(self, generator=None):
        """Random weights for a model built from a config alone: centred on zero, as trained ones
        are (the scale is ``1 + weight``)."""
        self.weight.copy_(0.1 * torch.randn(self.weight.shape, generator=generator, device=self.weight.device))
