# HONEST: the same pre-doubled weight as rms_load_scales_source_in_place, doubled into a new tensor
# while loading, so the tensor it is handed stays as it was.
import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        state_dict[prefix + "weight"] = state_dict[prefix + "weight"] * 2.0
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, x, residual=None):
        h = x.float()
        if residual is not None:
            h = h + residual.float()
            residual = h.to(x.dtype)
        h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * (self.weight / 2)
        return h if residual is None else (h, residual)
