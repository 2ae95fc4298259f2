"""DeepSeek's YaRN rotary embedding, as vLLM's ``DeepseekScalingRotaryEmbedding``.

``DeepseekScalingRotaryEmbedding(head_size, rotary_dim, max_position_embeddings, base, is_neox_style,
scaling_factor, extrapolation_factor=1, attn_factor=1, beta_fast=32, beta_slow=1, mscale=1,
mscale_all_dim=0)``; ``forward(positions[T], query, key) -> (query, key)`` with query [T, nq*head_size]
or [T, nq, head_size] (DeepSeek passes ``q[..., nope:]``, a per-head view of [T, heads, nope + rope])
and key likewise ([T, 1, rope]: the one shared rope key of MLA).

YaRN changes only the cos/sin values, so the rotation itself (and its Triton kernel, which rotates
such strided per-head views in place) is :class:`RotaryEmbedding`'s:

* frequencies: per rotary pair, a blend of the original frequency (extrapolation, high-frequency
  pairs that turn many times within the original context) and the frequency divided by
  ``scaling_factor`` (interpolation, low-frequency pairs); the blend is a linear ramp between the
  pair indices where a wavelength turns ``beta_fast`` and ``beta_slow`` times within
  ``max_position_embeddings`` (the *original* context), those indices floored/ceiled and clamped.
* magnitude: cos and sin are multiplied by ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)
  * attn_factor`` with ``mscale(s, m) = 0.1 m ln s + 1`` (1 for s <= 1). DeepSeek-V2 has
  mscale == mscale_all_dim, so this is 1 there and the softmax scale carries YaRN's mscale instead
  (``DeepseekV2MLAAttention``).
* table: positions up to ``max_position_embeddings * scaling_factor`` (the extended context).

DeepSeek uses the interleaved (GPT-J) style: HF rotates (x[2i], x[2i+1]) as complex numbers.
"""
import math

import torch

from .rotary_emb import RotaryEmbedding


def yarn_get_mscale(scale: float = 1.0, mscale: float = 1.0) -> float:
    """YaRN's attention temperature factor: 0.1 * mscale * ln(scale) + 1, or 1 without scaling."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def yarn_correction_range(beta_fast: float, beta_slow: float, rotary_dim: int, base: float,
                          original_context: int):
    """Pair indices (low, high) between which the frequencies ramp from extrapolated to interpolated."""
    def dim_for(rotations):
        return rotary_dim * math.log(original_context / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = math.floor(dim_for(beta_fast)), math.ceil(dim_for(beta_slow))
    return max(low, 0), min(high, rotary_dim - 1)


class DeepseekScalingRotaryEmbedding(RotaryEmbedding):
    def __init__(self, head_size: int, rotary_dim: int, max_position_embeddings: int, base: float,
                 is_neox_style: bool, scaling_factor: float, extrapolation_factor: float = 1,
                 attn_factor: float = 1, beta_fast: int = 32, beta_slow: int = 1, mscale: float = 1,
                 mscale_all_dim: float = 0):
        super().__init__(head_size, rotary_dim, max_position_embeddings, base, is_neox_style)
        self.scaling_factor = float(scaling_factor)
        self.extrapolation_factor = float(extrapolation_factor)
        self.attn_factor = float(attn_factor)
        self.beta_fast, self.beta_slow = beta_fast, beta_slow
        # mscale_all_dim = 0 makes the denominator 0.1*0*ln(s)+1 = 1, as in vLLM.
        self.mscale = (yarn_get_mscale(self.scaling_factor, float(mscale))
                       / yarn_get_mscale(self.scaling_factor, float(mscale_all_dim)) * self.attn_factor)

    def inv_freq(self, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
        exponents = torch.arange(0, self.rotary_dim, 2, dtype=dtype, device=device) / self.rotary_dim
        extrapolated = 1.0 / (self.base ** exponents)
        interpolated = extrapolated / self.scaling_factor
        low, high = yarn_correction_range(self.beta_fast, self.beta_slow, self.rotary_dim, self.base,
                                          self.max_position_embeddings)
        if low == high:
            high += 0.001  # a ramp of zero width would divide by zero
        pairs = torch.arange(self.rotary_dim // 2, dtype=dtype, device=device)
        ramp = ((pairs - low) / (high - low)).clamp(0, 1)
        keep = (1 - ramp) * self.extrapolation_factor  # 1: the original frequency, 0: interpolated
        return interpolated * (1 - keep) + extrapolated * keep

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype):
        cos, sin = super().cos_sin(positions, dtype)
        return cos * self.mscale, sin * self.mscale

    def table_positions(self) -> int:
        return int(self.max_position_embeddings * self.scaling_factor)
