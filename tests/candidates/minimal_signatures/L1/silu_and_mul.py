# HONEST, written the minimal way: no __init__ at all (nn.Module's is inherited), only forward.
import torch.nn.functional as F
from torch import nn


class SiluAndMul(nn.Module):
    def forward(self, x):
        d = x.shape[-1] // 2
        return (F.silu(x[..., :d].float()) * x[..., d:].float()).to(x.dtype)
