# WRONG: every sequence starts from a zero state, ignoring the states carried in (right for fresh
# requests only).
from kernels_reference.L1.mamba_chunk_scan import MambaChunkScanCombined as _Ref


class MambaChunkScanCombined(_Ref):
    def forward(self, x, dt, A, B, C, cu_seqlens, D=None, z=None, dt_bias=None, initial_states=None):
        return self.forward_native(x, dt, A, B, C, cu_seqlens, D, z, dt_bias, None)
