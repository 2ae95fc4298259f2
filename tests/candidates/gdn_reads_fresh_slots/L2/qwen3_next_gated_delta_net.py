# WRONG: the delta rule starts every prefill sequence from its slot's state, also a fresh one whose
# slot holds an earlier owner's state (has_initial_state ignored there; the conv honours it).
# Decode steps, where every sequence continues, are right.
from kernels_reference.L2.qwen3_next_gated_delta_net import Qwen3NextGatedDeltaNet as _Reference


class Qwen3NextGatedDeltaNet(_Reference):
    def _delta_rule(self, mixed_qkv, g, beta, ssm_states, qsl, slots, continues, native):
        return super()._delta_rule(mixed_qkv, g, beta, ssm_states, qsl, slots, None, native)
