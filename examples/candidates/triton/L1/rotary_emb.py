import math

import torch
import triton
import triton.language as tl
from torch import nn


@triton.jit
def _cos_sin(pos_ptr, freq_ptr, tok, tok_ok, pair, half):
    # cos and sin of each (token, frequency) angle, shaped [TOKENS, 1, HALF] to broadcast over heads.
    pos = tl.load(pos_ptr + tok, mask=tok_ok, other=0).to(tl.float32)
    freq = tl.load(freq_ptr + pair, mask=pair < half, other=0.0)
    angle = pos[:, None] * freq[None, :]  # float32, as production computes it
    # Reduce into [-pi, pi] before cos/sin, with 2*pi split as 6.28125 (few significant bits, so
    # turns * 6.28125 is exact in float32) plus the remainder: cos/sin then never see a large
    # argument, whatever precision the backend's cos/sin keep far from zero.
    turns = tl.floor(angle * 0.15915494309189535 + 0.5)
    angle = (angle - turns * 6.28125) - turns * 0.0019353071795864769
    return tl.cos(angle)[:, None, :], tl.sin(angle)[:, None, :]


@triton.jit
def _rope_tile(pos_ptr, src, dst, freq_ptr, tok0, head0, n_tokens, n_heads, src_stride, head_size, half,
               NEOX: tl.constexpr, TOKENS: tl.constexpr, HEADS: tl.constexpr, HALF: tl.constexpr,
               REST: tl.constexpr, PASS: tl.constexpr):
    # One [TOKENS, HEADS, HALF] tile: the angles are per (token, frequency), broadcast over heads.
    tok = tok0 + tl.arange(0, TOKENS)
    head = head0 + tl.arange(0, HEADS)
    pair = tl.arange(0, HALF)
    tok_ok = tok < n_tokens
    c, s = _cos_sin(pos_ptr, freq_ptr, tok, tok_ok, pair, half)
    t64 = tok.to(tl.int64)[:, None, None]
    h3 = head[None, :, None]
    src_head = src + t64 * src_stride + h3 * head_size
    dst_head = dst + t64 * n_heads * head_size + h3 * head_size
    _rotate(src_head, dst_head, tok_ok[:, None, None] & (h3 < n_heads), pair, c, s, half, head_size,
            NEOX, REST, PASS)


@triton.jit
def _rotate(src_head, dst_head, rows_ok, pair, c, s, half, head_size, NEOX: tl.constexpr, REST: tl.constexpr,
            PASS: tl.constexpr):
    # The rotation of a [TOKENS, HEADS, HALF] tile of pairs, each head's features at src_head / dst_head.
    ok = rows_ok & (pair[None, None, :] < half)
    if NEOX:
        ia = pair[None, None, :]
        ib = ia + half
    else:
        ia = 2 * pair[None, None, :]
        ib = ia + 1
    a = tl.load(src_head + ia, mask=ok, other=0.0).to(tl.float32)
    b = tl.load(src_head + ib, mask=ok, other=0.0).to(tl.float32)
    ty = dst_head.dtype.element_ty
    tl.store(dst_head + ia, (a * c - b * s).to(ty), mask=ok)
    tl.store(dst_head + ib, (b * c + a * s).to(ty), mask=ok)
    if PASS:  # partial rotary: the features after the rotary part are copied unchanged
        j = 2 * half + tl.arange(0, REST)[None, None, :]
        keep = rows_ok & (j < head_size)
        tl.store(dst_head + j, tl.load(src_head + j, mask=keep, other=0.0), mask=keep)


@triton.jit
def _rope(pos_ptr, q_src, q_dst, k_src, k_dst, freq_ptr, n_tokens, nq, nk, q_stride, k_stride,
          head_size, half,
          NEOX: tl.constexpr, TOKENS: tl.constexpr, HEADS: tl.constexpr, HALF: tl.constexpr,
          REST: tl.constexpr, PASS: tl.constexpr):
    # Axis 0: token blocks. Axis 1: head blocks of the query, then of the key, so both tensors
    # rotate in one launch.
    tok0 = tl.program_id(0) * TOKENS
    block = tl.program_id(1)
    q_blocks = tl.cdiv(nq, HEADS)
    if block < q_blocks:
        _rope_tile(pos_ptr, q_src, q_dst, freq_ptr, tok0, block * HEADS, n_tokens, nq, q_stride, head_size, half,
                   NEOX, TOKENS, HEADS, HALF, REST, PASS)
    else:
        _rope_tile(pos_ptr, k_src, k_dst, freq_ptr, tok0, (block - q_blocks) * HEADS, n_tokens, nk, k_stride,
                   head_size, half, NEOX, TOKENS, HEADS, HALF, REST, PASS)


@triton.jit
def _rope_one_tile(pos_ptr, q_src, q_dst, k_src, k_dst, freq_ptr, n_tokens, nq, nk, q_stride, k_stride,
                   head_size, half,
                   NEOX: tl.constexpr, TOKENS: tl.constexpr, HEADS: tl.constexpr, HALF: tl.constexpr,
                   REST: tl.constexpr, PASS: tl.constexpr):
    # Triton's interpreter pays per operation, not per element: the query's and the key's heads in
    # one [TOKENS, HEADS, HALF] tile (heads nq.. are the key's), the angles worked out once.
    tok = tl.program_id(0) * TOKENS + tl.arange(0, TOKENS)
    head = tl.arange(0, HEADS)
    pair = tl.arange(0, HALF)
    tok_ok = tok < n_tokens
    c, s = _cos_sin(pos_ptr, freq_ptr, tok, tok_ok, pair, half)
    t64 = tok.to(tl.int64)[:, None, None]
    h3 = head[None, :, None]
    is_q = h3 < nq
    src_head = tl.where(is_q, q_src + t64 * q_stride + h3 * head_size, k_src + t64 * k_stride + (h3 - nq) * head_size)
    dst_head = tl.where(is_q, q_dst + (t64 * nq + h3) * head_size, k_dst + (t64 * nk + h3 - nq) * head_size)
    _rotate(src_head, dst_head, tok_ok[:, None, None] & (h3 < nq + nk), pair, c, s, half, head_size,
            NEOX, REST, PASS)


def _inv_freq(rotary_dim, base, scaling):
    """Inverse frequencies worked out in float64 and rounded once to float32."""
    exps = torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim
    freqs = 1.0 / (float(base) ** exps)
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind == "llama3":
        ctx = scaling["original_max_position_embeddings"]
        lo, hi, factor = scaling["low_freq_factor"], scaling["high_freq_factor"], scaling["factor"]
        wave = 2 * math.pi / freqs
        mix = (ctx / wave - lo) / (hi - lo)
        slow = freqs / factor
        freqs = torch.where(wave < ctx / hi, freqs,
                            torch.where(wave > ctx / lo, slow, (1 - mix) * slow + mix * freqs))
    elif kind != "default":
        raise NotImplementedError(f"rope scaling {kind!r}")
    return freqs.to(torch.float32)


def _rows(x):
    """[T, heads * head_size] with unit feature stride (rows may be strided, e.g. qkv slices)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    return x.reshape(x.shape[0], -1)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_size, rotary_dim, max_position_embeddings, base, is_neox_style=True,
                 rope_scaling=None):
        super().__init__()
        self.head_size, self.rotary_dim, self.neox = head_size, rotary_dim, is_neox_style
        self._freqs = {"cpu": _inv_freq(rotary_dim, base, rope_scaling)}

    def _freqs_on(self, device):
        # Cached per device: a host-to-device copy inside forward would break CUDA-graph capture.
        key = str(device)
        if key not in self._freqs:
            self._freqs[key] = self._freqs["cpu"].to(device)
        return self._freqs[key]

    def forward(self, positions, query, key):
        positions = positions.reshape(-1)
        q, k = _rows(query), _rows(key)
        t, hs = q.shape[0], self.head_size
        q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
        if t:
            nq, nk = q.shape[1] // hs, k.shape[1] // hs
            half, rest = self.rotary_dim // 2, hs - self.rotary_dim
            half_p2, rest_p2 = triton.next_power_of_2(half), triton.next_power_of_2(max(rest, 1))
            row = max(2 * half_p2, rest_p2 if rest else 0)  # elements one head moves per tile
            if q.is_cuda:  # one token and ~1K elements per program: many short programs hide latency
                heads = min(triton.next_power_of_2(max(nq, nk)), max(1, 1024 // row))
                tokens, warps = 1, max(1, min(4, heads * row // 512))
            else:  # Triton's interpreter pays per program and operation: every head in one tile
                heads = triton.next_power_of_2(nq + nk)
                tokens = max(1, min((1 << 16) // (heads * row), triton.next_power_of_2(t)))
                _rope_one_tile[(triton.cdiv(t, tokens),)](
                    positions, q, q_out, k, k_out, self._freqs_on(q.device), t, nq, nk, q.stride(0), k.stride(0),
                    hs, half, NEOX=self.neox, TOKENS=tokens, HEADS=heads, HALF=half_p2, REST=rest_p2,
                    PASS=rest > 0)
                return q_out.view(query.shape), k_out.view(key.shape)
            grid = (triton.cdiv(t, tokens), triton.cdiv(nq, heads) + triton.cdiv(nk, heads))
            _rope[grid](
                positions, q, q_out, k, k_out, self._freqs_on(q.device), t, nq, nk, q.stride(0), k.stride(0),
                hs, half, NEOX=self.neox, TOKENS=tokens, HEADS=heads, HALF=half_p2, REST=rest_p2,
                PASS=rest > 0, num_warps=warps)
        return q_out.view(query.shape), k_out.view(key.shape)
