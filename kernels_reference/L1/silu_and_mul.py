"""SiluAndMul, the gated activation of Llama-style MLPs, as vLLM's ``SiluAndMul``.

``forward(x[..., 2d]) -> silu(x[..., :d]) * x[..., d:]``, computed in float32 and rounded once
(as vLLM's CUDA kernel does).
"""
import torch
import torch.nn.functional as F
from torch import nn

from ..dispatch import compute_dtype, use_fast_path
from ..records import RecordsInit

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

_BLOCK = 1024


class SiluAndMul(RecordsInit, nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if triton is not None and use_fast_path(x):
            return self.forward_triton(x)
        return self.forward_native(x)

    def forward_native(self, x):
        d = x.shape[-1] // 2
        xc = x.to(compute_dtype(x.dtype))
        return (F.silu(xc[..., :d]) * xc[..., d:]).to(x.dtype)

    def forward_triton(self, x):
        if x.shape[-1] % 2:
            raise ValueError(f"SiluAndMul needs an even last dimension, got {x.shape[-1]}")
        d = x.shape[-1] // 2
        if x.stride(-1) != 1:
            x = x.contiguous()
        try:
            rows = x.view(-1, 2 * d)
        except RuntimeError:
            rows = x.reshape(-1, 2 * d)
        out = torch.empty((*x.shape[:-1], d), dtype=x.dtype, device=x.device)
        if out.numel() == 0:
            return out
        grid = (rows.shape[0], triton.cdiv(d, _BLOCK))
        _silu_and_mul_kernel[grid](rows, out, rows.stride(0), d, BLOCK=_BLOCK, num_warps=4)
        return out


if triton is not None:

    @triton.jit
    def _silu_and_mul_kernel(x_ptr, out_ptr, x_row_stride, d, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < d
        gate = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + row * x_row_stride + d + cols, mask=mask, other=0.0).to(tl.float32)
        y = gate / (1.0 + tl.exp(-gate)) * up
        tl.store(out_ptr + row * d + cols, y.to(out_ptr.dtype.element_ty), mask=mask)
