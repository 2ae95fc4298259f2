# WRONG: the decode step adds dt_bias but skips the softplus (the prefill kernel's flag not passed).
from kernels_reference.L1.selective_state_update import SelectiveStateUpdate as _Ref


class SelectiveStateUpdate(_Ref):
    def forward(self, state, x, dt, A, B, C, D=None, z=None, dt_bias=None, state_batch_indices=None):
        self.dt_softplus = False
        return self.forward_native(state, x, dt, A, B, C, D, z, dt_bias, state_batch_indices)
