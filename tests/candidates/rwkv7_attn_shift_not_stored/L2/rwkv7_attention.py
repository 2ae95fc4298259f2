# WRONG: the token shift reads the carried rows but never stores each sequence's last token, so the
# next step would mix with a stale row. The shift pool is an in-place output compared whole and
# every step owns slots, so every case sees the unwritten rows.
from kernels_reference.L2.rwkv7_attention import RWKV7Attention as _Reference


class RWKV7Attention(_Reference):
    def token_shift(self, x, meta, shift_states):
        return super().token_shift(x, meta, shift_states.clone())  # the write lands in a discarded copy
