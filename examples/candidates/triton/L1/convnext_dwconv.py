import torch
import torch.nn.functional as F
from torch import nn


class ConvNeXtDwConvNorm(nn.Module):
    def __init__(self, dim, kernel_size=7, eps=1e-6, conv_bias=True):
        super().__init__()
        self.dim, self.kernel_size, self.eps = dim, kernel_size, eps
        # Only the parameter layouts of timm's block are used, so its checkpoints load.
        self.conv_dw = nn.Conv2d(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim, bias=conv_bias)
        self.norm = nn.LayerNorm(dim, eps=eps)

    def forward(self, x):
        b, c, h, w = x.shape
        k, p = self.kernel_size, self.kernel_size // 2
        # The convolution as k*k shifted multiply-adds on a zero-padded channels-last float32 copy:
        # every tap is a broadcast of one [C] weight row over the map, channels contiguous.
        padded = F.pad(x.permute(0, 2, 3, 1).float(), (0, 0, p, p, p, p))
        taps = self.conv_dw.weight.float().reshape(c, k * k).t()  # [k*k, C], tap (i, j) at i*k + j
        acc = torch.zeros((b, h, w, c), dtype=torch.float32, device=x.device)
        if self.conv_dw.bias is not None:
            acc += self.conv_dw.bias.float()
        for i in range(k):
            for j in range(k):
                acc += padded[:, i:i + h, j:j + w, :] * taps[i * k + j]
        # LayerNorm over channels in float32 (two passes: mean, then the centred variance), one rounding.
        mean = acc.mean(dim=-1, keepdim=True)
        centred = acc - mean
        rstd = torch.rsqrt(centred.square().mean(dim=-1, keepdim=True) + self.eps)
        return (centred * rstd * self.norm.weight.float() + self.norm.bias.float()).to(x.dtype)
