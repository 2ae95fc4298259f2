# CRASH: a Triton kernel storing far out of bounds. Under the CPU interpreter this writes into
# host memory the process does not own (segfault or heap corruption); on a GPU, an illegal address.
import torch
import triton
import triton.language as tl
from torch import nn


@triton.jit
def _bad_store(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    v = tl.load(x_ptr + i, mask=i < n, other=0.0)
    tl.store(y_ptr + i + (1 << 40), v, mask=i < n)


class SiluAndMul(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        out = torch.empty(*x.shape[:-1], x.shape[-1] // 2, dtype=x.dtype, device=x.device)
        _bad_store[(1,)](x, out, out.numel(), BLOCK=1024)
        return out
