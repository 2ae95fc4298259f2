"""DeepSeek's YaRN rotary embedding in plain PyTorch: per-pair frequencies blended between the
original and the ``scaling_factor``-interpolated ones by a linear ramp over the pair index, cos/sin
scaled by the ratio of the two YaRN temperatures, then the rotation (interleaved pairs or neox
halves) in float32, written back into the given views (production rotates in place)."""
import math

import torch
from torch import nn


def _temperature(scale, m):
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


class DeepseekScalingRotaryEmbedding(nn.Module):
    def __init__(self, head_size, rotary_dim, max_position_embeddings, base, is_neox_style, scaling_factor,
                 extrapolation_factor=1, attn_factor=1, beta_fast=32, beta_slow=1, mscale=1, mscale_all_dim=0):
        super().__init__()
        self.head_size, self.rotary_dim, self.neox = head_size, rotary_dim, is_neox_style
        half = rotary_dim // 2
        idx = torch.arange(half, dtype=torch.float32)
        original = base ** (-2 * idx / rotary_dim)

        def pair_for(turns):  # the pair whose wavelength turns `turns` times over the original context
            return rotary_dim * math.log(max_position_embeddings / (turns * 2 * math.pi)) / (2 * math.log(base))

        lo, hi = max(math.floor(pair_for(beta_fast)), 0), min(math.ceil(pair_for(beta_slow)), rotary_dim - 1)
        hi = hi + 0.001 if lo == hi else hi
        extrapolate = (1 - ((idx - lo) / (hi - lo)).clamp(0, 1)) * extrapolation_factor
        # A plain attribute, not a buffer (module.to(bfloat16) would round a buffer), so it stays on
        # the CPU: one copy per device is made on first use (the engine's eager warm-up), never inside
        # a CUDA-graph capture, which cannot copy from pageable host memory.
        self._freqs = {"cpu": original / scaling_factor * (1 - extrapolate) + original * extrapolate}
        self._gain = _temperature(scaling_factor, mscale) / _temperature(scaling_factor, mscale_all_dim) * attn_factor

    def _rotate(self, x, cos, sin):
        t = x.shape[0]
        heads = x.reshape(t, -1, self.head_size)
        rot = heads[..., : self.rotary_dim].float()
        if self.neox:
            a, b = rot.chunk(2, dim=-1)
        else:
            a, b = rot[..., 0::2], rot[..., 1::2]
        ra, rb = a * cos - b * sin, b * cos + a * sin
        rotated = torch.cat([ra, rb], -1) if self.neox else torch.stack([ra, rb], -1).flatten(-2)
        heads = torch.cat([rotated.to(x.dtype), heads[..., self.rotary_dim:]], -1)
        x.copy_(heads.reshape(x.shape))
        return x

    def forward(self, positions, query, key):
        where = str(positions.device)
        if where not in self._freqs:
            self._freqs[where] = self._freqs["cpu"].to(positions.device)
        angles = positions.reshape(-1, 1).float() * self._freqs[where][None]
        cos = (angles.cos() * self._gain)[:, None, :]
        sin = (angles.sin() * self._gain)[:, None, :]
        return self._rotate(query, cos, sin), self._rotate(key, cos, sin)
