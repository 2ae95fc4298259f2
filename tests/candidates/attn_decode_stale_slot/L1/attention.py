# WRONG, on decode steps only: a separate decode path (one query token per sequence) that attends
# over the cache before storing the step's key/value, so each decode token reads its own slot
# stale. Prefill (packed or chunked) is right: scoring that teacher-forces through prefill cannot
# see it.
import torch
from kernels_reference.L1.attention import Attention as _Ref, causal_attention, gather_kv, store_kv_cache
from kernels_reference.forward_context import get_forward_context


class Attention(_Ref):
    def forward(self, query, key, value):
        meta = get_forward_context()
        if meta is None or self.kv_cache is None or meta.max_query_len != 1:
            return self.forward_native(query, key, value)
        t, d = query.shape[0], self.head_size
        q = query.reshape(t, self.num_heads, d)
        out = torch.zeros_like(q)
        for i, n in enumerate(meta.seq_lens_cpu):
            if n == 0:  # a padding row of the padded decode batch
                continue
            ks = gather_kv(self.kv_cache[0], meta.block_tables[i], n)
            vs = gather_kv(self.kv_cache[1], meta.block_tables[i], n)
            out[i:i + 1] = causal_attention(q[i:i + 1], ks, vs, n - 1, self.scale)
        store_kv_cache(key.reshape(t, self.num_kv_heads, d), value.reshape(t, self.num_kv_heads, d),
                       self.kv_cache[0], self.kv_cache[1], meta.slot_mapping)
        return out.reshape(t, -1)
