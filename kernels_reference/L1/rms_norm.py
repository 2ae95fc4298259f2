"""RMSNorm with the optional fused residual add, as vLLM's ``RMSNorm`` layer.

Numerics follow vLLM: compute in float32, cast the normalised value to the input dtype, then
multiply by ``weight``. With ``residual`` the sum ``x + residual`` is formed in float32, returned
(rounded to the input dtype) as the updated residual, and normalised. The kernel also serves the
zero-centred ``GemmaRMSNorm`` (``gemma_rms_norm.py``).
"""
import functools
from typing import Optional, Tuple, Union

import torch
from torch import nn

from ..dispatch import compute_dtype, use_fast_path
from ..triton_rows import DECODE_ROWS, autotune, autotune_here, row_layout, size_class, warps_for
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
        return rms_norm_rows(self, x, residual)


def rms_norm_rows(norm: nn.Module, x, residual=None, unit_offset: bool = False, config=None):
    """The fast path of an RMSNorm-shaped module (``hidden_size``, ``variance_epsilon``,
    ``weight``): the rows of ``x`` normalised, the residual fused in; with ``unit_offset`` scaled
    by ``1 + weight`` (GemmaRMSNorm) rather than ``weight``. ``config`` (a ``triton.Config`` of
    ``_configs_for_block``'s kind) is launched instead of what the size rule or the autotuner
    would choose (``benchmarks/rms_norm_variants.py`` times them one by one)."""
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
    args = (rows.tensor, res.tensor, norm.weight, out, res_out,
            rows.n_rows, rows.n_inner, rows.stride_outer, rows.stride_inner,
            res.n_inner, res.stride_outer, res.stride_inner,
            norm.variance_epsilon, size_class(rows.n_rows))
    # int32 offsets (fewer address instructions per element) unless an offset could overflow
    index_64 = max(_last_offset(rows), _last_offset(res), rows.n_rows * norm.hidden_size) >= 2**31
    consts = dict(HAS_RESIDUAL=residual is not None, WIDTH=norm.hidden_size, BLOCK=block,
                  INDEX_64=index_64, UNIT_OFFSET=unit_offset)
    if config is None and autotune_here(x) and rows.n_rows > DECODE_ROWS:
        grid = lambda meta: (triton.cdiv(rows.n_rows, meta["ROWS"]),)  # noqa: E731
        _tuned_rms_norm(block)[grid](*args, **consts)
        return out if residual is None else (out, res_out)
    if config is None and autotune_here(x):  # decode sizes: the first (smallest) config, no tuning among equals
        config = _configs_for_block(block)[0]
    elif config is None:  # Interpreter: one fixed config, large tiles (it pays per program, not per element).
        rows_per_program = max(1, 16384 // block)
        config = triton.Config({"ROWS": rows_per_program}, num_warps=warps_for(block * rows_per_program))
    _rms_norm_kernel[(triton.cdiv(rows.n_rows, config.kwargs["ROWS"]),)](
        *args, **consts, **config.kwargs, num_warps=config.num_warps)
    return out if residual is None else (out, res_out)


def _last_offset(rows) -> int:
    """The largest element offset a kernel computes into ``rows``' tensor."""
    n = rows.n_rows - 1
    return (n // rows.n_inner) * rows.stride_outer + (n % rows.n_inner) * rows.stride_inner + rows.tensor.shape[-1]


def _configs_for_block(block: int):
    """(rows per program, warps) candidates for rows padded to ``block`` columns.

    Inductor's split for reductions: wide rows get one program per row with all warps on it (a
    "persistent reduction"), from 8 to 32 elements per thread; narrow rows (per-head norms, 128
    wide) get several rows per program and few warps, so a decode step's handful of rows spreads
    over as many SMs as possible (ROWS=1, one warp) while a prefill's half million rows amortise
    the per-program set-up (ROWS up to 32). These have no loop, so num_stages plays no role.

    ``CHUNK`` > 0 (wide rows only, from ``LOOPED_CONFIGS``) is Inductor's looped reduction: one
    pass sums the squares CHUNK columns at a time (and stores the residual), a second re-reads
    the row's inputs, which the first left in L2, and writes the output."""
    if block <= 512:
        pairs = [(1, 1), (2, 1), (4, 2), (8, 4), (16, 4), (32, 8)]
    elif block <= 2048:
        pairs = [(1, 2), (1, 4), (1, 8), (2, 4), (4, 8)]
    else:
        w = min(32, block // 1024)  # 32 elements per thread: the fewest warps worth trying
        pairs = sorted({(1, w), (1, min(32, 2 * w)), (1, min(32, 4 * w)), (2, min(32, 4 * w))})
    configs = [triton.Config({"ROWS": r, "CHUNK": 0}, num_warps=nw, num_stages=1) for r, nw in pairs]
    if block > 2048:
        configs += [triton.Config({"ROWS": 1, "CHUNK": c}, num_warps=nw, num_stages=1)
                    for c, nw in LOOPED_CONFIGS if c < block]
    return configs


# (chunk, warps) of the looped form among the wide-row configs (see _configs_for_block). Of twelve
# (512-2048 wide chunks, 2-16 warps) timed on an H100 beside Inductor at 3584 and 4096 wide, 8192 and
# 16384 tokens, 2048 x 16 warps was the only one to beat the one-piece kernel: by 0.1-0.7% on the
# fused-add norm, level with Inductor (docs/perf/h100-2026-12-06d.md); the others lost 1-36%.
LOOPED_CONFIGS = ((2048, 16),)


@functools.lru_cache(maxsize=None)
def _tuned_rms_norm(block: int):
    """The autotuned launcher for one padded width; one per width keeps each config list sane
    (32 rows of 4096 would spill registers) without a version-specific pruning hook."""
    return autotune(configs=_configs_for_block(block),
                    key=["WIDTH", "size_cls", "HAS_RESIDUAL", "INDEX_64"])(_rms_norm_kernel)


if triton is not None:

    @triton.jit(do_not_specialize=["size_cls"])
    def _rms_norm_kernel(
        x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr,
        n_rows, x_inner, x_s_outer, x_s_inner, r_inner, r_s_outer, r_s_inner,
        eps, size_cls,  # size_cls: only an autotune key (the row-count bucket)
        HAS_RESIDUAL: tl.constexpr, WIDTH: tl.constexpr, BLOCK: tl.constexpr, INDEX_64: tl.constexpr,
        ROWS: tl.constexpr, UNIT_OFFSET: tl.constexpr = False, CHUNK: tl.constexpr = 0,
    ):
        if CHUNK > 0:  # one row per program (ROWS == 1), in two passes over CHUNK-wide pieces
            _rms_norm_looped(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, x_inner, x_s_outer, x_s_inner,
                             r_inner, r_s_outer, r_s_inner, eps, HAS_RESIDUAL, WIDTH, BLOCK, INDEX_64,
                             UNIT_OFFSET, CHUNK)
        else:
            # The width is a compile-time constant (one compilation per hidden size): where it fills
            # the block (4096, 2048, 128 ...) no column mask is computed, and with one row per program
            # (the wide-row configs) no row mask either, so loads and stores are plain 16-byte vectors
            # (measured on the H200: 2-4% of the time at 8192-16384 tokens, Inductor's margin).
            pid = tl.program_id(0)
            if INDEX_64:
                pid = pid.to(tl.int64)
            row = pid * ROWS + tl.arange(0, ROWS)
            cols = tl.arange(0, BLOCK)
            x_off = ((row // x_inner) * x_s_outer + (row % x_inner) * x_s_inner)[:, None] + cols[None, :]
            out_off = row[:, None] * WIDTH + cols[None, :]
            # The weight is loaded with the rows, not after the reduction: for a decode step's few
            # rows the kernel is one memory latency long instead of two.
            if BLOCK == WIDTH and ROWS == 1:  # exactly one program per row and no padded column
                w = tl.load(w_ptr + cols, eviction_policy="evict_last")
                x = tl.load(x_ptr + x_off).to(tl.float32)
                mask = None
            else:
                mask = (row < n_rows)[:, None] & (cols < WIDTH)[None, :]
                w = tl.load(w_ptr + cols, mask=cols < WIDTH, other=0.0, eviction_policy="evict_last")
                x = tl.load(x_ptr + x_off, mask=mask, other=0.0).to(tl.float32)
            if HAS_RESIDUAL:
                r_off = ((row // r_inner) * r_s_outer + (row % r_inner) * r_s_inner)[:, None] + cols[None, :]
                if BLOCK == WIDTH and ROWS == 1:
                    x += tl.load(res_ptr + r_off).to(tl.float32)
                else:
                    x += tl.load(res_ptr + r_off, mask=mask, other=0.0).to(tl.float32)
                tl.store(res_out_ptr + out_off, x.to(res_out_ptr.dtype.element_ty), mask=mask)
            rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / WIDTH + eps)
            if UNIT_OFFSET:  # GemmaRMSNorm: scaled by 1 + weight in float32, rounded once
                y = x * rstd[:, None] * (1.0 + w.to(tl.float32))[None, :]
            else:  # vLLM's RMSNorm: rounded to the input dtype, then scaled by the weight
                y = (x * rstd[:, None]).to(out_ptr.dtype.element_ty).to(tl.float32) * w.to(tl.float32)[None, :]
            tl.store(out_ptr + out_off, y.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _load_chunk(ptr, cols, WIDTH: tl.constexpr, MASKED: tl.constexpr, POLICY: tl.constexpr):
        if MASKED:
            v = tl.load(ptr + cols, mask=cols < WIDTH, other=0.0, eviction_policy=POLICY)
        else:
            v = tl.load(ptr + cols, eviction_policy=POLICY)
        return v.to(tl.float32)

    @triton.jit
    def _store_chunk(ptr, cols, value, WIDTH: tl.constexpr, MASKED: tl.constexpr):
        if MASKED:
            tl.store(ptr + cols, value.to(ptr.dtype.element_ty), mask=cols < WIDTH)
        else:
            tl.store(ptr + cols, value.to(ptr.dtype.element_ty))

    @triton.jit
    def _rms_norm_looped(
        x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, x_inner, x_s_outer, x_s_inner, r_inner, r_s_outer,
        r_s_inner, eps, HAS_RESIDUAL: tl.constexpr, WIDTH: tl.constexpr, BLOCK: tl.constexpr,
        INDEX_64: tl.constexpr, UNIT_OFFSET: tl.constexpr, CHUNK: tl.constexpr,
    ):
        # The first pass keeps its loads in L2 (evict_last) for the second, their last use
        # (evict_first). The second forms x + residual again in float32 rather than reading the
        # rounded res_out back, so the numerics are the one-piece kernel's.
        row = tl.program_id(0)
        if INDEX_64:
            row = row.to(tl.int64)
        x_row = x_ptr + (row // x_inner) * x_s_outer + (row % x_inner) * x_s_inner
        r_row = res_ptr + (row // r_inner) * r_s_outer + (row % r_inner) * r_s_inner
        o_row = row * WIDTH
        masked: tl.constexpr = BLOCK != WIDTH
        acc = tl.zeros([CHUNK], dtype=tl.float32)
        for start in tl.static_range(0, BLOCK, CHUNK):
            cols = start + tl.arange(0, CHUNK)
            x = _load_chunk(x_row, cols, WIDTH, masked, "evict_last")
            if HAS_RESIDUAL:
                x += _load_chunk(r_row, cols, WIDTH, masked, "evict_last")
                _store_chunk(res_out_ptr + o_row, cols, x, WIDTH, masked)
            acc += x * x
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / WIDTH + eps)
        for start in tl.static_range(0, BLOCK, CHUNK):
            cols = start + tl.arange(0, CHUNK)
            x = _load_chunk(x_row, cols, WIDTH, masked, "evict_first")
            if HAS_RESIDUAL:
                x += _load_chunk(r_row, cols, WIDTH, masked, "evict_first")
            w = _load_chunk(w_ptr, cols, WIDTH, masked, "evict_last")
            if UNIT_OFFSET:  # as the one-piece kernel: GemmaRMSNorm rounds once, vLLM's RMSNorm twice
                y = x * rstd * (1.0 + w)
            else:
                y = (x * rstd).to(out_ptr.dtype.element_ty).to(tl.float32) * w
            _store_chunk(out_ptr + o_row, cols, y, WIDTH, masked)
