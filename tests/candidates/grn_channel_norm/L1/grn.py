# WRONG: the L2 norm taken over the channels of each pixel and averaged over the map (the axes of
# GRN swapped), instead of over the map per channel and averaged over the channels.
import torch
from kernels_reference.L1.grn import GlobalResponseNorm as _Ref


class GlobalResponseNorm(_Ref):
    def forward(self, x):
        xf = x.float()
        gx = torch.linalg.vector_norm(xf, dim=-1, keepdim=True)
        nx = gx / (gx.mean(dim=(1, 2), keepdim=True) + self.eps)
        return (xf + self.bias.float() + self.weight.float() * (xf * nx)).to(x.dtype)
