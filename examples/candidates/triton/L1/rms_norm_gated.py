# An honest gated RMSNorm in plain PyTorch: each group's root mean square from one vector norm
# over a [rows, groups, group] view (float32), the weight and the SiLU gate applied in float32
# and one rounding at the end.
import torch
import torch.nn.functional as F
from torch import nn


class RMSNormGated(nn.Module):
    def __init__(self, hidden_size, eps=1e-5, group_size=None, norm_before_gate=False, activation="swish"):
        super().__init__()
        self.eps, self.norm_before_gate = eps, norm_before_gate
        self.group = group_size or hidden_size
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x, z=None):
        h = x.float()
        silu_z = F.silu(z.float()) if z is not None else None
        if silu_z is not None and not self.norm_before_gate:
            h = h * silu_z
        g = h.reshape(*h.shape[:-1], -1, self.group)
        rms = torch.linalg.vector_norm(g, dim=-1, keepdim=True) * self.group ** -0.5
        y = (g / torch.sqrt(rms * rms + self.eps)).reshape(h.shape) * self.weight.float()
        if silu_z is not None and self.norm_before_gate:
            y = y * silu_z
        return y.to(x.dtype)
