# WRONG: attends correctly but never writes the step's keys/values into the cache, so the next
# decode step would read stale memory.
import torch
from kernels_reference.L1.attention import Attention as _Ref, causal_attention, gather_kv
from kernels_reference.forward_context import get_forward_context


class Attention(_Ref):
    def forward(self, query, key, value):
        meta = get_forward_context()
        t, d = query.shape[0], self.head_size
        q = query.reshape(t, self.num_heads, d)
        k = key.reshape(t, self.num_kv_heads, d)
        v = value.reshape(t, self.num_kv_heads, d)
        out = torch.empty_like(q)
        starts, lens = meta.query_start_loc.tolist(), meta.seq_lens.tolist()
        for i, n in enumerate(lens):
            a, b = starts[i], starts[i + 1]
            ctx = n - (b - a)
            ks = torch.cat([gather_kv(self.kv_cache[0], meta.block_tables[i], ctx), k[a:b]])
            vs = torch.cat([gather_kv(self.kv_cache[1], meta.block_tables[i], ctx), v[a:b]])
            out[a:b] = causal_attention(q[a:b], ks, vs, ctx, self.scale)
        return out.reshape(t, -1)
