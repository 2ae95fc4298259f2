# WRONG: assumes token i sits at position i (true only for a first prefill chunk).
import torch
from kernels_reference.L1.rotary_emb import RotaryEmbedding as _Ref


class RotaryEmbedding(_Ref):
    def forward(self, positions, query, key):
        return self.forward_native(torch.arange(positions.numel(), device=positions.device), query, key)
