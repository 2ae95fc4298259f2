import torch
import triton
import triton.language as tl
from torch import nn


@triton.jit
def _ln_rows(x_ptr, r_ptr, w_ptr, b_ptr, y_ptr, s_ptr, n_rows, x_stride, r_stride, width, eps,
             ROWS: tl.constexpr, CHUNK: tl.constexpr, ADD: tl.constexpr):
    # Statistics by chunks merged with Chan's parallel update (count, mean, M2), then a second
    # sweep that normalises: any width, registers bounded by ROWS x CHUNK.
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < n_rows
    rows64 = rows.to(tl.int64)[:, None]
    count = tl.zeros([ROWS], dtype=tl.float32)
    mean = tl.zeros([ROWS], dtype=tl.float32)
    m2 = tl.zeros([ROWS], dtype=tl.float32)
    for start in range(0, width, CHUNK):
        cols = start + tl.arange(0, CHUNK)
        ok = row_ok[:, None] & (cols[None, :] < width)
        v = tl.load(x_ptr + rows64 * x_stride + cols[None, :], mask=ok, other=0.0).to(tl.float32)
        if ADD:
            v = v + tl.load(r_ptr + rows64 * r_stride + cols[None, :], mask=ok, other=0.0).to(tl.float32)
            tl.store(s_ptr + rows64 * width + cols[None, :], v.to(s_ptr.dtype.element_ty), mask=ok)
        n_c = tl.minimum(width - start, CHUNK).to(tl.float32)
        mean_c = tl.sum(v, axis=1) / n_c
        d = tl.where(ok, v - mean_c[:, None], 0.0)
        m2_c = tl.sum(d * d, axis=1)
        total = count + n_c
        delta = mean_c - mean
        mean = mean + delta * (n_c / total)
        m2 = m2 + m2_c + delta * delta * (count * n_c / total)
        count = total
    inv = 1.0 / tl.sqrt(m2 / width + eps)
    for start in range(0, width, CHUNK):
        cols = start + tl.arange(0, CHUNK)
        ok = row_ok[:, None] & (cols[None, :] < width)
        v = tl.load(x_ptr + rows64 * x_stride + cols[None, :], mask=ok, other=0.0).to(tl.float32)
        if ADD:  # the unrounded sum again, as in the first sweep
            v = v + tl.load(r_ptr + rows64 * r_stride + cols[None, :], mask=ok, other=0.0).to(tl.float32)
        g = tl.load(w_ptr + cols, mask=cols < width, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=cols < width, other=0.0).to(tl.float32)
        out = (v - mean[:, None]) * inv[:, None] * g[None, :] + b[None, :]
        tl.store(y_ptr + rows64 * width + cols[None, :], out.to(y_ptr.dtype.element_ty), mask=ok)


def _as_rows(t, width):
    if t.stride(-1) != 1:
        t = t.contiguous()
    return t.reshape(-1, width)  # copies only when the rows cannot be viewed


class LayerNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True):
        super().__init__()
        self.hidden_size = hidden_size
        self.eps = eps
        # Always a weight and a bias inside the kernel; absent ones are constants 1 and 0.
        self.weight = nn.Parameter(torch.ones(hidden_size)) if elementwise_affine else None
        self.bias = nn.Parameter(torch.zeros(hidden_size)) if elementwise_affine and bias else None

    def forward(self, x, residual=None):
        width = self.hidden_size
        xs = _as_rows(x, width)
        n = xs.shape[0]
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        s = torch.empty(x.shape, dtype=x.dtype, device=x.device) if residual is not None else y
        rs = _as_rows(residual, width) if residual is not None else xs
        w = self.weight if self.weight is not None else torch.ones(width, device=x.device)
        b = self.bias if self.bias is not None else torch.zeros(width, device=x.device)
        if x.is_cuda:
            chunk = min(1024, triton.next_power_of_2(width))
            rows = max(1, 2048 // chunk)
        else:  # the interpreter pays per program and per loop step: whole rows, many at once
            chunk = triton.next_power_of_2(width)
            rows = max(1, min(triton.next_power_of_2(max(n, 1)), (1 << 16) // chunk))
        if n:
            _ln_rows[(triton.cdiv(n, rows),)](xs, rs, w, b, y, s, n, xs.stride(0), rs.stride(0), width, self.eps,
                                             ROWS=rows, CHUNK=chunk, ADD=residual is not None, num_warps=4)
        return y if residual is None else (y, s)
