# WRONG: the bonus term ((r * k * r_k).sum(-1) * v, FLA's gate_output_correction) is dropped: the
# gate multiplies the normed core output alone. Every case is off.
from kernels_reference.L2.rwkv7_attention import RWKV7Attention as _Reference


class RWKV7Attention(_Reference):
    def output_gate(self, o, r, k, v, g):
        return o * g
