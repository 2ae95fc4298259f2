# WRONG: the packed batch attended as one sequence (cu_seqlens ignored): each sentence also sees
# the tokens of the sentences packed beside it.
from kernels_reference.L1.encoder_attention import EncoderOnlyAttention as _Ref, bidirectional_attention, split_heads


class EncoderOnlyAttention(_Ref):
    def forward(self, query, key, value):
        q = split_heads(query, self.num_heads, self.head_size)
        k = split_heads(key, self.num_kv_heads, self.head_size)
        v = split_heads(value, self.num_kv_heads, self.head_size)
        return bidirectional_attention(q, k, v, self.scale).reshape(query.shape[0], -1)
