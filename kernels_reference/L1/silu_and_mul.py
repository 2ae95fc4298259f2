"""SiluAndMul, the gated activation of Llama-style MLPs, as vLLM's ``SiluAndMul``.

``forward(x[..., 2d]) -> silu(x[..., :d]) * x[..., d:]``, computed in float32 and rounded once
(as vLLM's CUDA kernel does).
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
except ImportError:
    triton = None


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
        n_out = out.numel()
        if n_out == 0:
            return out
        # 32-bit index arithmetic (Inductor's choice too) unless an offset could overflow it.
        index_64 = max(n_out, (rows.shape[0] - 1) * rows.stride(0) + 2 * d) >= 2**31
        args = (rows, out, n_out, rows.stride(0), size_class(rows.shape[0]))
        if autotune_here(x) and rows.shape[0] > DECODE_ROWS:
            grid = lambda meta: (triton.cdiv(n_out, meta["XBLOCK"]),)  # noqa: E731
            _silu_and_mul_tuned[grid](*args, D=d, INDEX_64=index_64)
        else:
            # Decode sizes and the interpreter: a fixed config. At a few rows every tuned config
            # is within timing noise and tuning would pick one at random (two copies of this
            # module then differed by up to 15% on the H200); what matters is latency, so the
            # block is sized to spread the few elements over about two programs per SM, each
            # thread still moving one 16-byte vector of bf16.
            xblock = (min(2048, max(256, triton.next_power_of_2(-(-n_out // 264)))) if x.is_cuda
                      else 16384)  # the interpreter pays per program, not per element
            _silu_and_mul_kernel[(triton.cdiv(n_out, xblock),)](
                *args, D=d, INDEX_64=index_64, XBLOCK=xblock, num_warps=max(1, xblock // 256))
        return out


if triton is not None:

    @triton.jit(do_not_specialize=["size_cls"])
    def _silu_and_mul_kernel(x_ptr, out_ptr, n_out, x_row_stride,
                             size_cls,  # only an autotune key (the row-count bucket)
                             D: tl.constexpr, INDEX_64: tl.constexpr, XBLOCK: tl.constexpr):
        # The output is walked as one flat range, as Inductor does for pointwise ops: no program
        # straddles a half-empty block at a row's end, and with D a multiple of 16 (every real
        # MLP width) the compiler still proves each thread's elements contiguous and loads them
        # as 16-byte vectors. D is a compile-time constant (one compilation per MLP width): the
        # per-element division by it becomes a multiply and a shift, where a run-time divisor
        # costs a long instruction sequence (measured on the H200: 4% of the time at 16384 tokens,
        # the whole gap to Inductor, whose generated code has the width as a literal).
        start = tl.program_id(0)
        if INDEX_64:
            start = start.to(tl.int64)
        offs = start * XBLOCK + tl.arange(0, XBLOCK)
        mask = offs < n_out
        row = offs // D
        src = row * x_row_stride + (offs - row * D)
        gate = tl.load(x_ptr + src, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + src + D, mask=mask, other=0.0).to(tl.float32)
        y = gate / (1.0 + tl.exp(-gate)) * up
        tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)

    # Inductor's pointwise range: XBLOCK 1024-4096 with 4 or 8 warps, i.e. 4 to 32 elements per
    # thread (one to four 16-byte vectors of bf16 per load). Keyed on the width and the row-count
    # bucket; dtypes are part of every autotune key already.
    _silu_and_mul_tuned = autotune(
        configs=[triton.Config({"XBLOCK": xb}, num_warps=nw, num_stages=1)
                 for xb in (1024, 2048, 4096) for nw in (4, 8)],
        key=["D", "size_cls"],
    )(_silu_and_mul_kernel)
