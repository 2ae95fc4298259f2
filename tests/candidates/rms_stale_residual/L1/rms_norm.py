# WRONG: a Triton kernel whose fused residual add normalises x + residual but hands back the old
# residual, so the residual stream never accumulates the layers' outputs (the plain form is right).
import torch
import triton
import triton.language as tl
from torch import nn


@triton.jit
def _kernel(x_ptr, r_ptr, w_ptr, y_ptr, n_rows, width, eps, ADD: tl.constexpr, BLOCK: tl.constexpr,
            ROWS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    m = (rows[:, None] < n_rows) & (cols[None, :] < width)
    offs = rows[:, None] * width + cols[None, :]
    x = tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.float32)
    if ADD:
        x += tl.load(r_ptr + offs, mask=m, other=0.0).to(tl.float32)
    r = tl.rsqrt(tl.sum(x * x, axis=1) / width + eps)
    w = tl.load(w_ptr + cols, mask=cols < width, other=0.0).to(tl.float32)
    y = (x * r[:, None]).to(y_ptr.dtype.element_ty).to(tl.float32) * w[None, :]
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=m)


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.hidden_size = hidden_size
        self.variance_epsilon = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x, residual=None):
        x = x.contiguous()
        add = residual is not None
        r = residual.contiguous() if add else x
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        n_rows = x.numel() // self.hidden_size
        _kernel[(triton.cdiv(n_rows, 16),)](x, r, self.weight, y, n_rows, self.hidden_size, self.variance_epsilon,
                                            ADD=add, BLOCK=triton.next_power_of_2(self.hidden_size), ROWS=16)
        return y if residual is None else (y, residual)
