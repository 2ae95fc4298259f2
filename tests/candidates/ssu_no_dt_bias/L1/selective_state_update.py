# WRONG: the decode step forgets dt_bias (softplus of the raw dt projection only).
from kernels_reference.L1.selective_state_update import SelectiveStateUpdate as _Ref


class SelectiveStateUpdate(_Ref):
    def forward(self, state, x, dt, A, B, C, D=None, z=None, dt_bias=None, state_batch_indices=None):
        return self.forward_native(state, x, dt, A, B, C, D, z, None, state_batch_indices)
