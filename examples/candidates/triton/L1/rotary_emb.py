import math

import torch
import triton
import triton.language as tl
from torch import nn


@triton.jit
def _rotate(pos_ptr, src, dst, inv_freq_ptr, src_stride, n_heads, head_size, half,
            NEOX: tl.constexpr, HALF: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, HALF)
    live = j < half
    angle = tl.load(pos_ptr + tok).to(tl.float32) * tl.load(inv_freq_ptr + j, mask=live, other=0.0)
    c, s = tl.cos(angle), tl.sin(angle)
    a_idx = j if NEOX else 2 * j
    b_idx = j + half if NEOX else 2 * j + 1
    for h in range(0, n_heads):
        src_head = src + tok * src_stride + h * head_size
        dst_head = dst + tok * n_heads * head_size + h * head_size
        a = tl.load(src_head + a_idx, mask=live, other=0.0).to(tl.float32)
        b = tl.load(src_head + b_idx, mask=live, other=0.0).to(tl.float32)
        tl.store(dst_head + a_idx, (a * c - b * s).to(dst.dtype.element_ty), mask=live)
        tl.store(dst_head + b_idx, (b * c + a * s).to(dst.dtype.element_ty), mask=live)


def _frequencies(rotary_dim, base, scaling):
    freqs = base ** (-(torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type"))
    if kind == "llama3":
        ctx = scaling["original_max_position_embeddings"]
        lo, hi, factor = scaling["low_freq_factor"], scaling["high_freq_factor"], scaling["factor"]
        wave = 2 * math.pi / freqs
        mix = ((ctx / wave) - lo) / (hi - lo)
        scaled = freqs / factor
        freqs = torch.where(wave > ctx / lo, scaled,
                            torch.where(wave < ctx / hi, freqs, (1 - mix) * scaled + mix * freqs))
    return freqs


class RotaryEmbedding(nn.Module):
    def __init__(self, head_size, rotary_dim, max_position_embeddings, base, is_neox_style=True,
                 rope_scaling=None):
        super().__init__()
        self.head_size, self.rotary_dim, self.neox = head_size, rotary_dim, is_neox_style
        self._freqs = {"cpu": _frequencies(rotary_dim, base, rope_scaling)}

    def _freqs_on(self, device):
        # Cached per device: a host-to-device copy inside forward would break CUDA-graph capture.
        key = str(device)
        if key not in self._freqs:
            self._freqs[key] = self._freqs["cpu"].to(device)
        return self._freqs[key]

    def _apply_one(self, positions, x):
        t = x.shape[0]
        rows = x if x.stride(-1) == 1 else x.contiguous()
        rows = rows.reshape(t, -1)
        out = rows.clone() if rows.is_contiguous() else rows.contiguous()
        heads = rows.shape[1] // self.head_size
        half = self.rotary_dim // 2
        if t:
            freqs = self._freqs_on(x.device)
            _rotate[(t,)](positions, rows, out, freqs, rows.stride(0), heads, self.head_size, half,
                          NEOX=self.neox, HALF=triton.next_power_of_2(half))
        return out.view(x.shape)

    def forward(self, positions, query, key):
        positions = positions.reshape(-1)
        return self._apply_one(positions, query), self._apply_one(positions, key)
