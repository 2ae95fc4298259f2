# HACK: returns a view of its input (it writes the result over the input's first half).
import torch.nn.functional as F
from torch import nn


class SiluAndMul(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        d = x.shape[-1] // 2
        out = x[..., :d]
        out.copy_((F.silu(x[..., :d].float()) * x[..., d:].float()).to(x.dtype))
        return out
