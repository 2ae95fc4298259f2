import math

import torch
import triton
import triton.language as tl
from torch import nn


@triton.jit
def _rope_2d(src_q, src_k, dst_q, dst_k, freq_ptr, n_tokens, seq_len, prefix, grid_h, grid_w,
             q_sb, q_st, q_sh, k_sb, k_st, k_sh, nq, nk, quarter,
             TOKENS: tl.constexpr, HEADS: tl.constexpr, QUARTER: tl.constexpr):
    # One [TOKENS, HEADS, QUARTER] tile of every sequence position, class and register tokens
    # included: they get angle 0 (cos 1, sin 0), which copies them exactly. Each head's features
    # fall in four quarters: (a, c) turn with the row centre, (b, d) with the column centre.
    t = tl.program_id(0) * TOKENS + tl.arange(0, TOKENS)
    t_ok = t < n_tokens
    t = tl.where(t_ok, t, 0).to(tl.int64)
    image, pos = t // seq_len, t % seq_len
    patch = pos - prefix
    is_patch = patch >= 0
    patch = tl.where(is_patch, patch, 0)
    y = (2.0 * (patch // grid_w).to(tl.float32) + 1.0) / grid_h - 1.0
    x = (2.0 * (patch % grid_w).to(tl.float32) + 1.0) / grid_w - 1.0
    m = tl.arange(0, QUARTER)
    m_ok = m < quarter
    freq = tl.load(freq_ptr + m, mask=m_ok, other=0.0)[None, :]  # 2 pi f_m
    scale = tl.where(is_patch, 1.0, 0.0)[:, None]
    ang_y = scale * y[:, None] * freq
    ang_x = scale * x[:, None] * freq
    cy, sy = tl.cos(ang_y)[:, None, :], tl.sin(ang_y)[:, None, :]
    cx, sx = tl.cos(ang_x)[:, None, :], tl.sin(ang_x)[:, None, :]

    h = tl.program_id(1) * HEADS + tl.arange(0, HEADS)
    in_q = h < nq
    h_ok = h < nq + nk
    hk = tl.where(in_q, 0, h - nq)
    hq = tl.where(in_q, h, 0)
    src = tl.where(in_q[None, :], src_q + image[:, None] * q_sb + pos[:, None] * q_st + hq[None, :] * q_sh,
                   src_k + image[:, None] * k_sb + pos[:, None] * k_st + hk[None, :] * k_sh)
    # outputs are packed [B, S, heads, d]
    d = 4 * quarter
    dst = tl.where(in_q[None, :], dst_q + (t[:, None] * nq + hq[None, :]) * d,
                   dst_k + (t[:, None] * nk + hk[None, :]) * d)
    ok = t_ok[:, None, None] & h_ok[None, :, None] & m_ok[None, None, :]
    src3 = src[:, :, None] + m[None, None, :]
    dst3 = dst[:, :, None] + m[None, None, :]
    a = tl.load(src3, mask=ok, other=0.0).to(tl.float32)
    b = tl.load(src3 + quarter, mask=ok, other=0.0).to(tl.float32)
    c = tl.load(src3 + 2 * quarter, mask=ok, other=0.0).to(tl.float32)
    e = tl.load(src3 + 3 * quarter, mask=ok, other=0.0).to(tl.float32)
    ty = dst_q.dtype.element_ty
    tl.store(dst3, (a * cy - c * sy).to(ty), mask=ok)
    tl.store(dst3 + 2 * quarter, (c * cy + a * sy).to(ty), mask=ok)
    tl.store(dst3 + quarter, (b * cx - e * sx).to(ty), mask=ok)
    tl.store(dst3 + 3 * quarter, (e * cx + b * sx).to(ty), mask=ok)


def _heads(x, head_size):
    """[B, S, heads, head_size] with unit feature stride (a view of qkv column slices when possible)."""
    if x.dim() == 3:
        x = x.unflatten(-1, (-1, head_size))
    return x if x.stride(-1) == 1 else x.contiguous()


class DINOv3ViTRopePositionEmbedding(nn.Module):
    def __init__(self, head_size, base=100.0, num_prefix_tokens=1):
        super().__init__()
        self.head_size, self.prefix = head_size, num_prefix_tokens
        # 2 pi * base^(-4m/d), worked out in float64 and rounded once
        m = torch.arange(head_size // 4, dtype=torch.float64)
        self._freqs = {"cpu": (2 * math.pi * float(base) ** (-4.0 * m / head_size)).to(torch.float32)}

    def _freqs_on(self, device):
        key = str(device)
        if key not in self._freqs:
            self._freqs[key] = self._freqs["cpu"].to(device)
        return self._freqs[key]

    def forward(self, query, key, grid_height, grid_width):
        q, k = _heads(query, self.head_size), _heads(key, self.head_size)
        batch, seq_len = q.shape[0], q.shape[1]
        if seq_len != self.prefix + grid_height * grid_width:
            raise ValueError(f"{seq_len} tokens is not {self.prefix} + {grid_height} x {grid_width}")
        q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
        n_tokens, nq, nk = batch * seq_len, q.shape[2], k.shape[2]
        quarter = self.head_size // 4
        if n_tokens:
            qp2 = triton.next_power_of_2(quarter)
            heads = min(triton.next_power_of_2(nq + nk), 16 if q.is_cuda else 64)
            budget = 2048 if q.is_cuda else 1 << 15
            tokens = max(1, min(budget // (heads * qp2), triton.next_power_of_2(n_tokens)))
            grid = (triton.cdiv(n_tokens, tokens), triton.cdiv(nq + nk, heads))
            _rope_2d[grid](q, k, q_out, k_out, self._freqs_on(q.device), n_tokens, seq_len, self.prefix,
                           grid_height, grid_width, q.stride(0), q.stride(1), q.stride(2),
                           k.stride(0), k.stride(1), k.stride(2), nq, nk, quarter,
                           TOKENS=tokens, HEADS=heads, QUARTER=qp2, num_warps=4)
        return q_out.view(query.shape), k_out.view(key.shape)
