# WRONG: the SSD scan starts every prefill sequence from its slot's state, also a fresh one whose
# slot holds an earlier owner's state (has_initial_state ignored there; the conv honours it).
# Decode steps, where every sequence continues, are right.
import copy

import torch

from kernels_reference.L2.mamba_mixer2 import MambaMixer2 as _Reference


class MambaMixer2(_Reference):
    def _prefill_scan(self, xbc, dt, ssm_states, phase, native):
        every = copy.copy(phase)
        every.continues = torch.ones_like(phase.continues)
        every.any_continues = True
        return super()._prefill_scan(xbc, dt, ssm_states, every, native)
