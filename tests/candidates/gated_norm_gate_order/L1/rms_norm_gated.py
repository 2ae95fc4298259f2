# WRONG: gates on the wrong side of the norm (norm(x * silu(z)) where the module asks for
# norm(x) * silu(z), and the other way round).
import torch
import torch.nn.functional as F
from torch import nn


class RMSNormGated(nn.Module):
    def __init__(self, hidden_size, eps=1e-5, group_size=None, norm_before_gate=False, activation="swish"):
        super().__init__()
        self.eps, self.norm_before_gate = eps, norm_before_gate
        self.group = group_size or hidden_size
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x, z):
        h, gate = x.float(), F.silu(z.float())
        if self.norm_before_gate:  # the bug: swapped branches
            h = h * gate
        g = h.unflatten(-1, (-1, self.group))
        y = (g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.eps)).flatten(-2) * self.weight.float()
        if not self.norm_before_gate:
            y = y * gate
        return y.to(x.dtype)
