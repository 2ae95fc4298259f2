# WRONG: applies silu to the second half (the "up" projection) instead of the first.
import torch.nn.functional as F
from torch import nn


class SiluAndMul(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        d = x.shape[-1] // 2
        return (x[..., :d].float() * F.silu(x[..., d:].float())).to(x.dtype)
