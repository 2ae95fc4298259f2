# WRONG: the key-padding mask is accepted and dropped (vLLM's vision layer has none): real tokens
# also attend to the padding of their batch entry.
from kernels_reference.L1.encoder_attention import MultiHeadAttention as _Ref


class MultiHeadAttention(_Ref):
    def forward(self, query, key, value, attention_mask=None):
        return self.forward_native(query, key, value)
