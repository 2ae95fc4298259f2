# WRONG: eps added to the standard deviation, (x - mean) / (sqrt(var) + eps), not inside the sqrt.
from kernels_reference.L1.layer_norm import LayerNorm as _Ref


class LayerNorm(_Ref):
    def forward(self, x, residual=None):
        dtype = x.dtype
        x = x.float()
        if residual is not None:
            x = x + residual.float()
            residual = x.to(dtype)
        centred = x - x.mean(-1, keepdim=True)
        std = centred.pow(2).mean(-1, keepdim=True).sqrt()
        y = (centred / (std + self.eps) * self.weight.float() + self.bias.float()).to(dtype)
        return y if residual is None else (y, residual)
