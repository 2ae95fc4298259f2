# WRONG: returns bias + weight * (x * Nx), the residual x left out (the paper's formula read
# without its "+ X").
import torch
from kernels_reference.L1.grn import GlobalResponseNorm as _Ref


class GlobalResponseNorm(_Ref):
    def forward(self, x):
        xf = x.float()
        gx = torch.linalg.vector_norm(xf, dim=(1, 2), keepdim=True)
        nx = gx / (gx.mean(dim=-1, keepdim=True) + self.eps)
        return (self.bias.float() + self.weight.float() * (xf * nx)).to(x.dtype)
