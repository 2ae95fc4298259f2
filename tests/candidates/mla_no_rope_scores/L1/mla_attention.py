# WRONG: scores use only the no-rope part of every key (the shared rope key k_pe is left out), so
# the attention is blind to positions.
import torch
from kernels_reference.L1.mla_attention import MLAAttention as _Ref


class MLAAttention(_Ref):
    def expand(self, latent, native):
        keys, values = super().expand(latent, native)
        keys = torch.cat([keys[..., : self.qk_nope_head_dim], torch.zeros_like(keys[..., self.qk_nope_head_dim:])], -1)
        return keys, values
