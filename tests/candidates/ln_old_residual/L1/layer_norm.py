# WRONG: the fused-add path returns the residual it was given instead of x + residual.
from kernels_reference.L1.layer_norm import LayerNorm as _Ref


class LayerNorm(_Ref):
    def forward(self, x, residual=None):
        if residual is None:
            return self.forward_native(x)
        out, _ = self.forward_native(x, residual)
        return out, residual.clone()
