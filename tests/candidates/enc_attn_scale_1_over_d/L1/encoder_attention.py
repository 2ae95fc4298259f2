# WRONG: scores scaled by 1/d (a muP-style temperature) instead of the scale the layer is given
# (1/sqrt(d) for these models): a softmax several times too flat.
from kernels_reference.L1.encoder_attention import EncoderOnlyAttention as _Packed, MultiHeadAttention as _Padded


class EncoderOnlyAttention(_Packed):
    def __init__(self, num_heads, head_size, scale, num_kv_heads=None):
        super().__init__(num_heads, head_size, 1.0 / head_size, num_kv_heads)


class MultiHeadAttention(_Padded):
    def __init__(self, num_heads, head_size, scale, num_kv_heads=None):
        super().__init__(num_heads, head_size, 1.0 / head_size, num_kv_heads)
