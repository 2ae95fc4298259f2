# WRONG: the token shift ignores the carried shift state: every sequence's first token of the step
# mixes with zeros, as if the sequence were fresh (the rows are still stored). Steps whose
# sequences are all fresh are right; any continuing sequence (decodes, later prefill chunks) is off.
import dataclasses

from kernels_reference.L2.rwkv7_attention import RWKV7Attention as _Reference


class RWKV7Attention(_Reference):
    def token_shift(self, x, meta, shift_states):
        fresh = dataclasses.replace(meta, seq_lens=meta.query_start_loc.diff())  # has_initial_state: all False
        return super().token_shift(x, fresh, shift_states)
