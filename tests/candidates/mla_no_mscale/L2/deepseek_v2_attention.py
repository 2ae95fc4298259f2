# WRONG: softmax scale qk_head_dim ** -0.5 without YaRN's mscale ** 2 (a 1.59x colder softmax for
# DeepSeek-V2-Lite).
from kernels_reference.L2.deepseek_v2_attention import DeepseekV2MLAAttention as _Ref


class DeepseekV2MLAAttention(_Ref):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.mla_attn.scale = self.qk_head_dim ** -0.5
