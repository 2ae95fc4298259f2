"""RMSNorm with the optional fused residual add, as vLLM's ``RMSNorm`` layer.

Numerics follow vLLM: compute in float32, cast the normalised value to the input dtype, then
multiply by ``weight``. With ``residual`` the sum ``x + residual`` is formed in float32, returned
(rounded to the input dtype) as the updated residual, and normalised.
"""
from typing import Optional, Tuple, Union

import torch
from torch import nn

from ..dispatch import compute_dtype, use_fast_path
from ..triton_rows import row_layout, warps_for
from ..records import RecordsInit

try:
    import triton
    import triton.language as tl
except ImportError:  # the native path still works without Triton
    triton = None


class RMSNorm(RecordsInit, nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.hidden_size = hidden_size
        self.variance_epsilon = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

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
        variance = x.pow(2).mean(dim=-1, keepdim=True)
        x = (x * torch.rsqrt(variance + self.variance_epsilon)).to(orig_dtype) * self.weight
        return x if residual is None else (x, residual)

    def forward_triton(self, x, residual=None):
        if x.shape[-1] != self.hidden_size:
            raise ValueError(f"RMSNorm({self.hidden_size}) got rows of width {x.shape[-1]}")
        rows = row_layout(x)
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        if residual is not None:
            res = row_layout(residual.expand_as(x))
            res_out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        else:
            res, res_out = rows, out  # unused by the kernel when HAS_RESIDUAL is False
        if rows.n_rows == 0:
            return out if residual is None else (out, res_out)
        block = triton.next_power_of_2(self.hidden_size)
        # Narrow rows (Qwen3's per-head q/k norm: 128 wide, 32 heads per token) would leave each
        # program a few hundred bytes of work; several rows per program keep loads in flight.
        rows_per_program = max(1, 2048 // block)
        _rms_norm_kernel[(triton.cdiv(rows.n_rows, rows_per_program),)](
            rows.tensor, res.tensor, self.weight, out, res_out,
            rows.n_rows, rows.n_inner, rows.stride_outer, rows.stride_inner,
            res.n_inner, res.stride_outer, res.stride_inner,
            self.hidden_size, self.variance_epsilon,
            HAS_RESIDUAL=residual is not None, ROWS=rows_per_program, BLOCK=block,
            num_warps=warps_for(block * rows_per_program),
        )
        return out if residual is None else (out, res_out)


if triton is not None:

    @triton.jit
    def _rms_norm_kernel(
        x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr,
        n_rows, x_inner, x_s_outer, x_s_inner, r_inner, r_s_outer, r_s_inner,
        width, eps,
        HAS_RESIDUAL: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK)
        mask = (row < n_rows)[:, None] & (cols < width)[None, :]
        x_off = (row // x_inner) * x_s_outer + (row % x_inner) * x_s_inner
        x = tl.load(x_ptr + x_off[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        out_off = row[:, None] * width + cols[None, :]
        if HAS_RESIDUAL:
            r_off = (row // r_inner) * r_s_outer + (row % r_inner) * r_s_inner
            x += tl.load(res_ptr + r_off[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            tl.store(res_out_ptr + out_off, x.to(res_out_ptr.dtype.element_ty), mask=mask)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / width + eps)
        y = (x * rstd[:, None]).to(out_ptr.dtype.element_ty).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=cols < width, other=0.0).to(tl.float32)
        tl.store(out_ptr + out_off, (y * w[None, :]).to(out_ptr.dtype.element_ty), mask=mask)
