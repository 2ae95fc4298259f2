# WRONG: a Triton kernel whose reduction hard-codes the width of Llama-3.1-8B (4096).
import torch
import triton
import triton.language as tl
from torch import nn


@triton.jit
def _kernel(x_ptr, w_ptr, y_ptr, stride, width, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = cols < width
    x = tl.load(x_ptr + row * stride + cols, mask=m, other=0.0).to(tl.float32)
    r = tl.rsqrt(tl.sum(x * x, axis=0) / 4096 + eps)
    w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * width + cols, ((x * r).to(y_ptr.dtype.element_ty).to(tl.float32) * w).to(y_ptr.dtype.element_ty), mask=m)


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.hidden_size = hidden_size
        self.variance_epsilon = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x, residual=None):
        if residual is not None:
            x = x + residual
            residual = x
        rows = x.reshape(-1, self.hidden_size)
        y = torch.empty_like(rows)
        _kernel[(rows.shape[0],)](rows, self.weight, y, rows.stride(0), self.hidden_size,
                                  self.variance_epsilon, BLOCK=triton.next_power_of_2(self.hidden_size))
        y = y.view(x.shape)
        return y if residual is None else (y, residual)
