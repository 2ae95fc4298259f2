# WRONG: stores the step's keys/values but attends only within the new tokens, ignoring the
# context already in the paged cache (right for a first prefill chunk only).
import torch
from kernels_reference.L1.attention import Attention as _Ref, causal_attention, store_kv_cache
from kernels_reference.forward_context import get_forward_context


class Attention(_Ref):
    def forward(self, query, key, value):
        meta = get_forward_context()
        t, d = query.shape[0], self.head_size
        q = query.reshape(t, self.num_heads, d)
        k = key.reshape(t, self.num_kv_heads, d)
        v = value.reshape(t, self.num_kv_heads, d)
        store_kv_cache(k, v, self.kv_cache[0], self.kv_cache[1], meta.slot_mapping)
        out = torch.empty_like(q)
        starts = meta.query_start_loc.tolist()
        for a, b in zip(starts, starts[1:]):
            out[a:b] = causal_attention(q[a:b], k[a:b], v[a:b], 0, self.scale)
        return out.reshape(t, -1)
