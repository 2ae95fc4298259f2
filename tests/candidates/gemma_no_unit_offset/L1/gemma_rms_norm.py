# Wrong: a zero-centred norm scaled by its weight, not by 1 + weight (a plain RMSNorm kernel reused
# for Qwen3-Next's norms). Every case is far off: trained weights sit near zero.
import torch
from torch import nn


class GemmaRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.variance_epsilon = eps
        self.weight = nn.Parameter(torch.zeros(hidden_size))

    def forward(self, x, residual=None):
        h = x.float() if residual is None else x.float() + residual.float()
        y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon) * self.weight.float()
        return y.to(x.dtype) if residual is None else (y.to(x.dtype), h.to(x.dtype))
