import torch
import triton
import triton.language as tl
from torch import nn


@triton.jit
def _channel_norms(x_ptr, g_ptr, pixels, channels, ROWS: tl.constexpr, COLS: tl.constexpr):
    # One program per (image, channel block) walks every pixel of its image: the norms come out
    # whole, no partial sums to combine.
    image = tl.program_id(0)
    cols = tl.program_id(1) * COLS + tl.arange(0, COLS)
    col_ok = cols < channels
    base = x_ptr + image.to(tl.int64) * pixels * channels
    acc = tl.zeros([COLS], dtype=tl.float32)
    for start in range(0, pixels, ROWS):
        rows = start + tl.arange(0, ROWS)
        ok = (rows < pixels)[:, None] & col_ok[None, :]
        v = tl.load(base + rows.to(tl.int64)[:, None] * channels + cols[None, :], mask=ok, other=0.0).to(tl.float32)
        acc += tl.sum(v * v, axis=0)
    tl.store(g_ptr + image * channels + cols, tl.sqrt(acc), mask=col_ok)


@triton.jit
def _scale_shift(x_ptr, s_ptr, b_ptr, y_ptr, n, channels, per_image, BLOCK: tl.constexpr):
    # Flat over every element: channel = offset % C, image = offset // (H W C).
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    c = offs % channels
    s = tl.load(s_ptr + (offs // per_image) * channels + c, mask=ok, other=0.0)
    b = tl.load(b_ptr + c, mask=ok, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, (x * s + b).to(y_ptr.dtype.element_ty), mask=ok)


class GlobalResponseNorm(nn.Module):
    def __init__(self, dim, eps=1e-6, channels_last=True):
        super().__init__()
        self.dim, self.eps, self.channels_last = dim, eps, channels_last
        shape = (1, 1, 1, dim) if channels_last else (1, dim, 1, 1)
        self.weight = nn.Parameter(torch.zeros(shape))
        self.bias = nn.Parameter(torch.zeros(shape))

    def forward(self, x):
        if not self.channels_last:  # kernels read channels-last rows; a permuted copy in and out
            return self.forward_nhwc(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self.forward_nhwc(x)

    def forward_nhwc(self, x):
        x = x.contiguous()
        b, h, w, c = x.shape
        y = torch.empty_like(x)
        if x.numel() == 0:
            return y
        norms = torch.empty((b, c), dtype=torch.float32, device=x.device)
        cols = min(128, triton.next_power_of_2(c)) if x.is_cuda else triton.next_power_of_2(c)
        rows = 16 if x.is_cuda else max(1, min(triton.next_power_of_2(h * w), (1 << 15) // cols))
        _channel_norms[(b, triton.cdiv(c, cols))](x, norms, h * w, c, ROWS=rows, COLS=cols, num_warps=4)
        # The per-channel factor 1 + weight * Nx is [B, C]: a few small torch ops.
        nx = norms / (norms.mean(dim=1, keepdim=True) + self.eps)
        scale = (1.0 + self.weight.reshape(1, c).float() * nx).contiguous()
        block = 4096 if x.is_cuda else 1 << 16
        _scale_shift[(triton.cdiv(x.numel(), block),)](x, scale, self.bias, y, x.numel(), c, h * w * c,
                                                       BLOCK=block, num_warps=4)
        return y
