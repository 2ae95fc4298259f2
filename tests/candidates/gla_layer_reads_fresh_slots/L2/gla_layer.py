# WRONG: every prefill sequence starts from its slot's state, also a fresh one whose slot holds an
# earlier owner's state (has_initial_state ignored). Steps without a fresh sequence are right.
import dataclasses

from kernels_reference.L2.gla_layer import GatedLinearAttention as _Reference


class GatedLinearAttention(_Reference):
    def _recurrence(self, q, k, v, gk, states, phase, native):
        return super()._recurrence(q, k, v, gk, states, dataclasses.replace(phase, continues=None), native)
