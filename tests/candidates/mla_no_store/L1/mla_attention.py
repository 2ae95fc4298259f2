# WRONG: attends correctly (to a private copy of the cache holding this step's rows) but never
# writes the step's latent rows into the layer's cache, so the next step would read stale memory.
from kernels_reference.L1.mla_attention import MLAAttention as _Ref


class MLAAttention(_Ref):
    def forward(self, q, kv_c_normed, k_pe):
        shared = self.kv_cache
        self.kv_cache = None if shared is None else shared.clone()
        try:
            return self.forward_native(q, kv_c_normed, k_pe)
        finally:
            self.kv_cache = shared
