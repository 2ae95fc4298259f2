# WRONG: the linear-attention layer's delta rule starts every prefill sequence from its slot's
# state, also a fresh one whose slot holds an earlier owner's state (has_initial_state ignored).
# Decode steps (every sequence continues) and the full-attention layer (no state) are right.
from kernels_reference.L2.qwen3_next_gated_delta_net import Qwen3NextGatedDeltaNet
from kernels_reference.L3.qwen3_next_decoder_layer import Qwen3NextDecoderLayer as _Reference


class _EveryPrefillContinues(Qwen3NextGatedDeltaNet):
    def _delta_rule(self, mixed_qkv, g, beta, ssm_states, qsl, slots, continues, native):
        return super()._delta_rule(mixed_qkv, g, beta, ssm_states, qsl, slots, None, native)


class Qwen3NextDecoderLayer(_Reference):
    def __init__(self, config, layer_idx=0):
        super().__init__(config, layer_idx)
        if hasattr(self, "linear_attn"):
            self.linear_attn.__class__ = _EveryPrefillContinues
