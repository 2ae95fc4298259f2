# HONEST, with *args/**kwargs: the constructor names only what it uses, forward takes anything
# and reads the reference's argument names (positions, query, key) from where they come.
import math

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    def __init__(self, head_size, rotary_dim, *args, base=10000.0, is_neox_style=True, rope_scaling=None,
                 **kwargs):
        super().__init__()
        self.head_size, self.rotary_dim, self.neox = head_size, rotary_dim, is_neox_style
        self.base = args[1] if len(args) > 1 else base
        self.scaling = rope_scaling

    def _rotate(self, positions, x):
        t = x.shape[0]
        heads = x.reshape(t, -1, self.head_size).float()
        rot, keep = heads[..., : self.rotary_dim], heads[..., self.rotary_dim:]
        inv = self.base ** (-torch.arange(0, self.rotary_dim, 2, dtype=torch.float32, device=x.device) / self.rotary_dim)
        if self.scaling:  # Llama-3: long wavelengths slowed by `factor`, short kept, a ramp between
            s = self.scaling
            wave = 2 * math.pi / inv
            ramp = (s["original_max_position_embeddings"] / wave - s["low_freq_factor"]) / (
                s["high_freq_factor"] - s["low_freq_factor"])
            inv = torch.lerp(inv / s["factor"], inv, ramp.clamp(0, 1))
        angle = positions.reshape(-1, 1).float() * inv
        cos, sin = angle.cos()[:, None, :], angle.sin()[:, None, :]
        if self.neox:
            a, b = rot.chunk(2, dim=-1)
            rot = torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
        else:
            a, b = rot[..., 0::2], rot[..., 1::2]
            rot = torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)
        return torch.cat([rot, keep], dim=-1).to(x.dtype).reshape(x.shape)

    def forward(self, *args, **kwargs):
        names = ("positions", "query", "key")
        values = dict(zip(names, args), **kwargs)
        return self._rotate(values["positions"], values["query"]), self._rotate(values["positions"], values["key"])
