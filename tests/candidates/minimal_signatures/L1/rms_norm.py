# HONEST, with an unusual but compatible signature: an extra optional constructor parameter and a
# forward that takes extra keyword arguments it does not need.
import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6, *, upcast=True):
        super().__init__()
        self.eps, self.upcast = eps, upcast
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x, residual=None, **unused):
        h = x.float()
        if residual is not None:
            h = h + residual.float()
            residual = h.to(x.dtype)
        h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight
        return h if residual is None else (h, residual)
