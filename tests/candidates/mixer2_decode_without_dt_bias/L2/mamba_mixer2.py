# WRONG: the decode step's state update gets no dt_bias (softplus(dt) instead of softplus(dt +
# dt_bias)), so decode tokens take far too large steps. Prefill sequences are right.
from kernels_reference.L2.mamba_mixer2 import MambaMixer2 as _Reference


class MambaMixer2(_Reference):
    def _decode_scan(self, xbc, dt, ssm_states, slots, native):
        x, b, c = self._split_conv_output(xbc)
        p, n = self.head_dim, self.ssm_state_size
        y = self.state_update(ssm_states, x, dt[:, :, None].expand(-1, -1, p),
                              self._a()[:, None, None].expand(-1, p, n), b, c, self.D[:, None].expand(-1, p),
                              z=None, dt_bias=None, state_batch_indices=slots)
        return y.reshape(xbc.shape[0], self.intermediate_size)
