# WRONG: a decoder's causal mask inside an encoder: token i never sees the tokens after it.
import torch

from kernels_reference.forward_context import get_forward_context
from kernels_reference.L1.encoder_attention import EncoderOnlyAttention as _Packed, MultiHeadAttention as _Padded


def _causal(q, k, v, scale, key_mask=None):
    """q [L, heads, d] over k/v [L, heads, d], lower-triangular (and key-padding) mask, float32."""
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
    allowed = torch.ones(q.shape[0], k.shape[0], dtype=torch.bool, device=q.device).tril()
    if key_mask is not None:
        allowed = allowed & key_mask[None, :]
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", probs, v.float()).to(q.dtype)


class EncoderOnlyAttention(_Packed):
    def forward(self, query, key, value):
        t, d = query.shape[0], self.head_size
        q, k, v = query.reshape(t, -1, d), key.reshape(t, -1, d), value.reshape(t, -1, d)
        meta = get_forward_context()
        starts = meta.query_start_loc.tolist() if meta is not None else [0, t]
        out = torch.cat([_causal(q[a:b], k[a:b], v[a:b], self.scale) for a, b in zip(starts, starts[1:])])
        return out.reshape(t, -1)


class MultiHeadAttention(_Padded):
    def forward(self, query, key, value, attention_mask=None):
        b, s, d = query.shape[0], query.shape[1], self.head_size
        q, k, v = query.reshape(b, s, -1, d), key.reshape(b, s, -1, d), value.reshape(b, s, -1, d)
        out = torch.stack([_causal(q[i], k[i], v[i], self.scale, None if attention_mask is None else attention_mask[i])
                           for i in range(b)])
        return out.reshape(b, s, -1)
