# WRONG: rotates interleaved pairs where the model is neox style, and vice versa.
from kernels_reference.L1.rotary_emb import RotaryEmbedding as _Ref


class RotaryEmbedding(_Ref):
    def forward(self, positions, query, key):
        self.is_neox_style = not self.is_neox_style
        try:
            return self.forward_native(positions, query, key)
        finally:
            self.is_neox_style = not self.is_neox_style
