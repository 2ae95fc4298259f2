"""GELU of encoder MLPs (``nn.GELU``), exact or tanh-approximate, with the dense layer's bias fused in.

Encoders run dense -> GELU -> dense. BERT, MiniLM, XLM-R (BGE-M3) and DINOv2 use the exact form
(HF ``hidden_act="gelu"``, vLLM ``get_act_fn("gelu")``: ``nn.GELU()``); SigLIP uses the tanh
approximation (``"gelu_pytorch_tanh"``: ``nn.GELU(approximate="tanh")``). Serving stacks fold the
intermediate dense's bias into the activation (a bias + GELU epilogue after a GEMM without bias),
so ``forward`` takes that bias as an optional second input: ``forward(x, bias) = gelu(x + bias)``
with ``bias`` of shape ``[N]`` broadcast over the rows of ``x[..., N]``.

Numerics: the sum and the activation in float32 (the bias sum is never rounded to the activation
dtype), one rounding at the end. The module has no parameters.
"""
import torch
import torch.nn.functional as F
from torch import nn

from ..dispatch import compute_dtype, use_fast_path
from ..records import RecordsInit
from ..triton_rows import DECODE_ROWS, autotune, autotune_here, size_class

try:
    import triton
    import triton.language as tl
except ImportError:  # the native path still works without Triton
    triton = None

APPROXIMATIONS = ("none", "tanh")


# HF's hidden_act names of the GELUs -> nn.GELU's ``approximate`` (vLLM's get_act_fn maps them alike)
GELU_APPROXIMATION = {"gelu": "none", "gelu_pytorch_tanh": "tanh", "gelu_new": "tanh"}


def gelu_approximation(hidden_act: str) -> str:
    """``approximate`` for a config's ``hidden_act``; a clear error for an activation that is no GELU."""
    if hidden_act not in GELU_APPROXIMATION:
        raise ValueError(f"unsupported hidden_act {hidden_act!r}; known: {sorted(GELU_APPROXIMATION)}")
    return GELU_APPROXIMATION[hidden_act]


class GELU(RecordsInit, nn.Module):
    def __init__(self, approximate: str = "none"):
        super().__init__()
        if approximate not in APPROXIMATIONS:
            raise ValueError(f"approximate must be one of {APPROXIMATIONS}, got {approximate!r}")
        self.approximate = approximate

    def forward(self, x: torch.Tensor, bias: torch.Tensor = None) -> torch.Tensor:
        if triton is not None and use_fast_path(x, bias):
            return self.forward_triton(x, bias)
        return self.forward_native(x, bias)

    def forward_native(self, x, bias=None):
        xc = x.to(compute_dtype(x.dtype))
        if bias is not None:
            xc = xc + bias.to(xc.dtype)
        return F.gelu(xc, approximate=self.approximate).to(x.dtype)

    def forward_triton(self, x, bias=None):
        return gelu_rows(x, bias, self.approximate == "tanh")

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


def gelu_rows(x: torch.Tensor, bias, tanh: bool) -> torch.Tensor:
    """The fast path: rows of ``x`` read through their row stride (a slice of a wider buffer is
    not copied), the output packed in ``x``'s shape and dtype."""
    n = x.shape[-1]
    if bias is not None and bias.numel() != n:
        raise ValueError(f"GELU bias has {bias.numel()} elements, rows are {n} wide")
    if x.stride(-1) != 1:
        x = x.contiguous()
    try:
        rows = x.view(-1, n)
    except RuntimeError:  # rows that no single stride describes: pack them once
        rows = x.reshape(-1, n)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n_out = out.numel()
    if n_out == 0:
        return out
    b = bias.contiguous().view(-1) if bias is not None else out  # placeholder, never read
    index_64 = max(n_out, (rows.shape[0] - 1) * rows.stride(0) + n) >= 2**31
    args = (rows, b, out, n_out, rows.stride(0), size_class(rows.shape[0]))
    consts = dict(N=n, HAS_BIAS=bias is not None, TANH=tanh, INDEX_64=index_64, PACKED=rows.stride(0) == n)
    if autotune_here(x) and rows.shape[0] > DECODE_ROWS:
        grid = lambda meta: (triton.cdiv(n_out, meta["XBLOCK"]),)  # noqa: E731
        _gelu_tuned[grid](*args, **consts)
    else:
        # A few rows are latency-bound (tuning would pick among equals at random): a block that
        # spreads the elements over about two programs per SM. The interpreter pays per program.
        xblock = (min(2048, max(256, triton.next_power_of_2(-(-n_out // 264)))) if x.is_cuda
                  else 1 << 16)
        _gelu_kernel[(triton.cdiv(n_out, xblock),)](*args, **consts, XBLOCK=xblock,
                                                    num_warps=max(1, min(8, xblock // 256)))
    return out


if triton is not None:

    @triton.jit(do_not_specialize=["size_cls"])
    def _gelu_kernel(x_ptr, bias_ptr, out_ptr, n_out, x_row_stride,
                     size_cls,  # only an autotune key (the row-count bucket)
                     N: tl.constexpr, HAS_BIAS: tl.constexpr, TANH: tl.constexpr, INDEX_64: tl.constexpr,
                     PACKED: tl.constexpr, XBLOCK: tl.constexpr):
        # A flat walk over the output, as for SiluAndMul: N is a compile-time constant, so the
        # division that finds an element's row is a multiply and a shift, and with N a multiple
        # of 16 (every real MLP width) each thread's elements are provably contiguous.
        start = tl.program_id(0)
        if INDEX_64:
            start = start.to(tl.int64)
        offs = start * XBLOCK + tl.arange(0, XBLOCK)
        mask = offs < n_out
        row = offs // N
        col = offs - row * N
        # Packed rows (the usual case) read at the output's offsets: plainly contiguous, whatever the
        # compiler proves about the row arithmetic (MiniLM's erf GELU at 16384 x 1536 ran 3% behind
        # F.gelu on an H100 on 2026-12-06 with the row form only; this form is not yet timed).
        x_offs = offs if PACKED else row * x_row_stride + col
        v = tl.load(x_ptr + x_offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            v += tl.load(bias_ptr + col, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        if TANH:
            # 0.5 * (1 + tanh(u)) is sigmoid(2u): no cancellation in 1 + tanh(u) where u is very
            # negative. One exp of -2|u| (at most 1, never overflowing) serves both signs.
            u = 0.7978845608028654 * (v + 0.044715 * v * v * v)  # sqrt(2 / pi) (x + 0.044715 x^3)
            e = tl.exp(-2.0 * tl.abs(u))
            y = tl.where(u >= 0, v, v * e) / (1.0 + e)
        else:
            y = 0.5 * v * (1.0 + tl.math.erf(v * 0.7071067811865476))  # x Phi(x), Phi by erf(x / sqrt 2)
        tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)

    # Inductor's pointwise range (see SiluAndMul): 4 to 32 elements per thread, keyed on the width
    # and the row-count bucket.
    _gelu_tuned = autotune(
        configs=[triton.Config({"XBLOCK": xb}, num_warps=nw, num_stages=1)
                 for xb in (1024, 2048, 4096) for nw in (4, 8)],
        key=["N", "size_cls", "HAS_BIAS", "TANH"],
    )(_gelu_kernel)
