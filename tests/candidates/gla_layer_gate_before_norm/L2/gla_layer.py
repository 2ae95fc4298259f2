# WRONG: the output gate multiplies the core's output before the RMSNorm (norm(o * swish(g)), the
# Mamba-2 order) instead of after it (norm(o) * swish(g), FLA's FusedRMSNormGated). Every case.
from kernels_reference.L2.gla_layer import GatedLinearAttention as _Reference


class GatedLinearAttention(_Reference):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.g_norm_swish_gate.norm_before_gate = False
