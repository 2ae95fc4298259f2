# WRONG: the fused bias is accepted and never added (the epilogue of a GEMM that had no bias).
from kernels_reference.L1.gelu import GELU as _Ref


class GELU(_Ref):
    def forward(self, x, bias=None):
        return self.forward_native(x)
