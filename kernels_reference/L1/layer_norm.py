"""LayerNorm with weight and bias and the optional fused residual add, as encoders run it.

BERT / XLM-R (post-norm "add & norm": ``LayerNorm(hidden + input_tensor)``), SigLIP and DINOv2
(pre-norm ViTs) all use ``nn.LayerNorm(hidden, eps)`` with a weight and a bias; vLLM's BERT keeps
``nn.LayerNorm`` and timm's ``LayerNorm`` is the same op. Parameters are ``weight`` and ``bias``,
so Hugging Face checkpoints load unchanged.

Numerics follow PyTorch's LayerNorm kernels on half types: mean and variance (biased, over the
last dimension) in float32, ``(x - mean) * rstd * weight + bias`` in float32, one rounding to the
activation dtype. With ``residual`` the sum ``x + residual`` is formed in float32, returned
(rounded) as the new residual and normalised: the same contract as ``RMSNorm``'s fused add.
(HF's BERT rounds the sum before normalising; the difference is one rounding of the input,
within the calibrated bar.)
"""
import functools
from typing import Optional, Tuple, Union

import torch
from torch import nn

from ..dispatch import compute_dtype, use_fast_path
from ..records import RecordsInit
from ..triton_rows import DECODE_ROWS, autotune, autotune_here, row_layout, size_class, warps_for

try:
    import triton
    import triton.language as tl
except ImportError:  # the native path still works without Triton
    triton = None


class LayerNorm(RecordsInit, nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True):
        super().__init__()
        self.hidden_size = hidden_size
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(hidden_size))
            self.bias = nn.Parameter(torch.zeros(hidden_size)) if bias else None
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

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
        mean = x.mean(dim=-1, keepdim=True)
        centred = x - mean
        variance = centred.pow(2).mean(dim=-1, keepdim=True)  # biased, as nn.LayerNorm
        y = centred * torch.rsqrt(variance + self.eps)
        if self.weight is not None:
            y = y * self.weight.to(y.dtype)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        y = y.to(orig_dtype)
        return y if residual is None else (y, residual)

    def forward_triton(self, x, residual=None):
        return layer_norm_rows(self, x, residual)

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


def layer_norm_rows(norm: LayerNorm, x, residual=None):
    """The fast path: the rows of ``x`` (strided views described by ``row_layout``, no copy)
    normalised with the residual fused in, outputs packed."""
    if x.shape[-1] != norm.hidden_size:
        raise ValueError(f"{type(norm).__name__}({norm.hidden_size}) got rows of width {x.shape[-1]}")
    rows = row_layout(x)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if residual is not None:
        res = row_layout(residual.expand_as(x))
        res_out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    else:
        res, res_out = rows, out  # unused by the kernel when HAS_RESIDUAL is False
    if rows.n_rows == 0:
        return out if residual is None else (out, res_out)
    block = triton.next_power_of_2(norm.hidden_size)
    w = norm.weight if norm.weight is not None else out  # placeholders when absent (never read)
    b = norm.bias if norm.bias is not None else out
    args = (rows.tensor, res.tensor, w, b, out, res_out,
            rows.n_rows, rows.n_inner, rows.stride_outer, rows.stride_inner,
            res.n_inner, res.stride_outer, res.stride_inner, norm.eps, size_class(rows.n_rows))
    index_64 = max(_last_offset(rows), _last_offset(res), rows.n_rows * norm.hidden_size) >= 2**31
    consts = dict(HAS_RESIDUAL=residual is not None, HAS_WEIGHT=norm.weight is not None,
                  HAS_BIAS=norm.bias is not None, WIDTH=norm.hidden_size, BLOCK=block, INDEX_64=index_64)
    if autotune_here(x) and rows.n_rows > DECODE_ROWS:
        grid = lambda meta: (triton.cdiv(rows.n_rows, meta["ROWS"]),)  # noqa: E731
        _tuned_layer_norm(block)[grid](*args, **consts)
    elif autotune_here(x):  # a few rows: latency-bound, every config is an equal; take the smallest
        config = _configs_for_block(block)[0]
        _layer_norm_kernel[(triton.cdiv(rows.n_rows, config.kwargs["ROWS"]),)](
            *args, **consts, ROWS=config.kwargs["ROWS"], num_warps=config.num_warps)
    else:  # interpreter: large tiles (it pays per program, not per element)
        rows_per_program = max(1, 16384 // block)
        _layer_norm_kernel[(triton.cdiv(rows.n_rows, rows_per_program),)](
            *args, **consts, ROWS=rows_per_program, num_warps=warps_for(block * rows_per_program))
    return out if residual is None else (out, res_out)


def _last_offset(rows) -> int:
    n = rows.n_rows - 1
    return (n // rows.n_inner) * rows.stride_outer + (n % rows.n_inner) * rows.stride_inner + rows.tensor.shape[-1]


def _configs_for_block(block: int):
    """(rows per program, warps): encoder widths are 384-1536, so narrow rows get several rows per
    program and wide ones a program each (the RMSNorm split, see ``rms_norm._configs_for_block``)."""
    if block <= 512:
        # the last three move 8-24 KB a program: MiniLM's 384-wide rows at 16384 tokens trailed
        # Inductor by 3.4% with the first five (H100, 2026-12-06, docs/perf/h100-2026-12-06g.md)
        pairs = [(1, 1), (2, 1), (4, 2), (8, 4), (16, 4), (8, 8), (16, 8), (32, 8)]
    elif block <= 2048:
        pairs = [(1, 2), (1, 4), (1, 8), (2, 4), (4, 8)]
    else:
        w = min(32, block // 1024)
        pairs = sorted({(1, w), (1, min(32, 2 * w)), (1, min(32, 4 * w))})
    return [triton.Config({"ROWS": r}, num_warps=nw, num_stages=1) for r, nw in pairs]


@functools.lru_cache(maxsize=None)
def _tuned_layer_norm(block: int):
    return autotune(configs=_configs_for_block(block),
                    key=["WIDTH", "size_cls", "HAS_RESIDUAL", "INDEX_64"])(_layer_norm_kernel)


if triton is not None:

    @triton.jit(do_not_specialize=["size_cls"])
    def _layer_norm_kernel(
        x_ptr, res_ptr, w_ptr, b_ptr, out_ptr, res_out_ptr,
        n_rows, x_inner, x_s_outer, x_s_inner, r_inner, r_s_outer, r_s_inner,
        eps, size_cls,  # size_cls: only an autotune key (the row-count bucket)
        HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
        WIDTH: tl.constexpr, BLOCK: tl.constexpr, INDEX_64: tl.constexpr, ROWS: tl.constexpr,
    ):
        # Whole rows live in registers (encoder widths are at most a few thousand), so the
        # statistics are two exact passes over registers, not a one-pass E[x^2] - E[x]^2 that
        # cancels catastrophically when the mean is large against the spread.
        pid = tl.program_id(0)
        if INDEX_64:
            pid = pid.to(tl.int64)
        row = pid * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK)
        col_ok = cols < WIDTH
        mask = (row < n_rows)[:, None] & col_ok[None, :]
        x_off = ((row // x_inner) * x_s_outer + (row % x_inner) * x_s_inner)[:, None] + cols[None, :]
        out_off = row[:, None] * WIDTH + cols[None, :]
        x = tl.load(x_ptr + x_off, mask=mask, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            r_off = ((row // r_inner) * r_s_outer + (row % r_inner) * r_s_inner)[:, None] + cols[None, :]
            x += tl.load(res_ptr + r_off, mask=mask, other=0.0).to(tl.float32)
            tl.store(res_out_ptr + out_off, x.to(res_out_ptr.dtype.element_ty), mask=mask)
        mean = tl.sum(x, axis=1) / WIDTH
        centred = tl.where(col_ok[None, :], x - mean[:, None], 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=1) / WIDTH + eps)
        y = centred * rstd[:, None]
        if HAS_WEIGHT:
            y = y * tl.load(w_ptr + cols, mask=col_ok, other=0.0, eviction_policy="evict_last").to(tl.float32)[None, :]
        if HAS_BIAS:
            y = y + tl.load(b_ptr + cols, mask=col_ok, other=0.0, eviction_policy="evict_last").to(tl.float32)[None, :]
        tl.store(out_ptr + out_off, y.to(out_ptr.dtype.element_ty), mask=mask)
