# WRONG: the prefill part of a step takes its has_initial_state flags from the start of the batch,
# not from after the decodes. Without decodes that is the same; in a mixed step the prefills get
# the (all true) flags of the decodes, so a fresh prompt continues its slot's leftovers.
from kernels_reference.L2.mamba_mixer2 import MambaMixer2 as _Reference


class MambaMixer2(_Reference):
    @staticmethod
    def plan(meta, tokens):
        phases = _Reference.plan(meta, tokens)
        if len(phases) == 2:
            prefill = phases[1]
            prefill.continues = meta.has_initial_state[: prefill.slots.numel()]
            prefill.any_continues = bool(prefill.continues.any())
        return phases
