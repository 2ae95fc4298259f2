# WRONG: a decode step's new recurrent states are computed and used for its output but never
# written back to the pool (the next step would repeat the old state). Prefill steps are right.
from kernels_reference.L2.qwen3_next_gated_delta_net import Qwen3NextGatedDeltaNet as _Reference


class Qwen3NextGatedDeltaNet(_Reference):
    def _delta_rule(self, mixed_qkv, g, beta, ssm_states, qsl, slots, continues, native):
        decode = continues is None
        pool = ssm_states.clone() if decode else ssm_states
        return super()._delta_rule(mixed_qkv, g, beta, pool, qsl, slots, continues, native)
