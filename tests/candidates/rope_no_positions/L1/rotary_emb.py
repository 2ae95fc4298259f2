# WRONG: never reads positions (every token rotated as if at position 0, i.e. not rotated at all);
# otherwise a plain, honest RoPE module. The kernel-level task and the end-to-end cases must both
# catch it.
import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    def __init__(self, head_size, rotary_dim, max_position_embeddings, base, is_neox_style=True,
                 rope_scaling=None):
        super().__init__()
        self.head_size = head_size

    def forward(self, positions, query, key):
        return query.clone(), key.clone()
