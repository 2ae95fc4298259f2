import torch
import triton
import triton.language as tl
from torch import nn


@triton.jit
def _rmsnorm_rows(x_ptr, r_ptr, w_ptr, y_ptr, s_ptr, n_rows, x_stride, r_stride, width, eps,
                  ROWS: tl.constexpr, COLS: tl.constexpr, ADD: tl.constexpr, PLUS_ONE: tl.constexpr = False):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, COLS)
    ok = (rows[:, None] < n_rows) & (cols[None, :] < width)
    rows64 = rows.to(tl.int64)[:, None]
    v = tl.load(x_ptr + rows64 * x_stride + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    if ADD:
        v = v + tl.load(r_ptr + rows64 * r_stride + cols[None, :], mask=ok, other=0.0).to(tl.float32)
        tl.store(s_ptr + rows64 * width + cols[None, :], v.to(s_ptr.dtype.element_ty), mask=ok)
    inv = tl.rsqrt(tl.sum(v * v, axis=1) / width + eps)
    g = tl.load(w_ptr + cols, mask=cols < width, other=0.0).to(tl.float32)
    if PLUS_ONE:  # zero-centred weight (GemmaRMSNorm)
        g = g + 1.0
    out = v * inv[:, None] * g[None, :]
    tl.store(y_ptr + rows64 * width + cols[None, :], out.to(y_ptr.dtype.element_ty), mask=ok)


def _as_rows(t, width):
    if t.stride(-1) != 1:
        t = t.contiguous()
    return t.reshape(-1, width)  # copies only when the rows cannot be viewed


class RMSNorm(nn.Module):
    plus_one = False

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.hidden_size = hidden_size
        self.variance_epsilon = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x, residual=None):
        width = self.hidden_size
        xs = _as_rows(x, width)
        n = xs.shape[0]
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        s = torch.empty(x.shape, dtype=x.dtype, device=x.device) if residual is not None else y
        rs = _as_rows(residual, width) if residual is not None else xs
        cols = triton.next_power_of_2(width)
        # A GPU wants ~4K-element tiles; Triton's interpreter (CPU) pays per program, so bigger ones.
        rows = max(1, min(16, 4096 // cols)) if x.is_cuda else max(1, min(triton.next_power_of_2(n), (1 << 16) // cols))
        if n:
            _rmsnorm_rows[(triton.cdiv(n, rows),)](
                xs, rs, self.weight, y, s, n, xs.stride(0), rs.stride(0), width,
                self.variance_epsilon, ROWS=rows, COLS=cols, ADD=residual is not None, PLUS_ONE=self.plus_one,
                num_warps=4)
        return y if residual is None else (y, s)

