# WRONG: ignores is_neox_style and always rotates neox halves; DeepSeek's rope pairs interleave.
from kernels_reference.L1.deepseek_rotary_emb import DeepseekScalingRotaryEmbedding as _Ref


class DeepseekScalingRotaryEmbedding(_Ref):
    def __init__(self, head_size, rotary_dim, max_position_embeddings, base, is_neox_style, scaling_factor,
                 extrapolation_factor=1, attn_factor=1, beta_fast=32, beta_slow=1, mscale=1, mscale_all_dim=0):
        super().__init__(head_size, rotary_dim, max_position_embeddings, base, True, scaling_factor,
                         extrapolation_factor, attn_factor, beta_fast, beta_slow, mscale, mscale_all_dim)
