# WRONG: normalises and scales but never adds the bias (an RMSNorm-style epilogue).
import torch
from kernels_reference.L1.layer_norm import LayerNorm as _Ref


class LayerNorm(_Ref):
    def forward(self, x, residual=None):
        dtype = x.dtype
        x = x.float()
        if residual is not None:
            x = x + residual.float()
            residual = x.to(dtype)
        y = torch.nn.functional.layer_norm(x, (self.hidden_size,), self.weight.float(), None, self.eps).to(dtype)
        return y if residual is None else (y, residual)
