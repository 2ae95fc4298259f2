# The zero-centred RMSNorm (Qwen3-Next): this tree's RMSNorm kernel with the weight read as 1 + w.
from torch import nn

from .rms_norm import RMSNorm


class GemmaRMSNorm(RMSNorm):
    plus_one = True

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__(hidden_size, eps)
        nn.init.zeros_(self.weight)
