# WRONG: reads and writes the states of rows 0..B-1 of the pool instead of the batch's slots
# (right only when the slots happen to be the first B in order).
from kernels_reference.L1.selective_state_update import SelectiveStateUpdate as _Ref


class SelectiveStateUpdate(_Ref):
    def forward(self, state, x, dt, A, B, C, D=None, z=None, dt_bias=None, state_batch_indices=None):
        return self.forward_native(state, x, dt, A, B, C, D, z, dt_bias, None)
