import torch
import triton
import triton.language as tl
from torch import nn


@triton.jit
def _gelu_tiles(x_ptr, b_ptr, y_ptr, n_rows, width, x_stride,
                ROWS: tl.constexpr, COLS: tl.constexpr, ADD_BIAS: tl.constexpr, TANH: tl.constexpr):
    # A [ROWS, COLS] tile per program: the bias slice is loaded once and broadcast over the rows.
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * COLS + tl.arange(0, COLS)
    col_ok = cols < width
    ok = (rows < n_rows)[:, None] & col_ok[None, :]
    r64 = rows.to(tl.int64)[:, None]
    v = tl.load(x_ptr + r64 * x_stride + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    if ADD_BIAS:
        v = v + tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if TANH:
        # tanh(u) = sign(u) (1 - e) / (1 + e) with e = exp(-2|u|) <= 1: never overflows
        u = 0.7978845608028654 * v * (1.0 + 0.044715 * v * v)
        e = tl.exp(-2.0 * tl.abs(u))
        t = (1.0 - e) / (1.0 + e)
        t = tl.where(u < 0, -t, t)
        out = 0.5 * v * (1.0 + t)
    else:
        out = 0.5 * v * (1.0 + tl.math.erf(v * 0.7071067811865476))
    tl.store(y_ptr + r64 * width + cols[None, :], out.to(y_ptr.dtype.element_ty), mask=ok)


class GELU(nn.Module):
    def __init__(self, approximate: str = "none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, x, bias=None):
        width = x.shape[-1]
        if x.stride(-1) != 1:
            x = x.contiguous()
        xs = x.reshape(-1, width)  # a view when the rows share one stride
        n = xs.shape[0]
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        if n == 0 or width == 0:
            return y
        b = bias.contiguous() if bias is not None else xs
        cols = min(1024, triton.next_power_of_2(width))
        if x.is_cuda:
            rows = max(1, 4096 // cols)
        else:  # the interpreter pays per program: big tiles
            rows = max(1, min(triton.next_power_of_2(n), (1 << 16) // cols))
        grid = (triton.cdiv(n, rows), triton.cdiv(width, cols))
        _gelu_tiles[grid](xs, b, y, n, width, xs.stride(0), ROWS=rows, COLS=cols,
                          ADD_BIAS=bias is not None, TANH=self.approximate == "tanh", num_warps=4)
        return y
