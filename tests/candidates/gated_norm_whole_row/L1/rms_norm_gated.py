# WRONG: normalises each row as a whole, ignoring group_size (right whenever a row is one group,
# as in both real models' layers).
import torch
import torch.nn.functional as F
from torch import nn


class RMSNormGated(nn.Module):
    def __init__(self, hidden_size, eps=1e-5, group_size=None, norm_before_gate=False, activation="swish"):
        super().__init__()
        self.eps, self.norm_before_gate = eps, norm_before_gate
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x, z):
        h, gate = x.float(), F.silu(z.float())
        if not self.norm_before_gate:
            h = h * gate
        y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()
        if self.norm_before_gate:
            y = y * gate
        return y.to(x.dtype)
