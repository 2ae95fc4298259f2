"""Token-by-token Triton kernel of RWKV-7's time mix: the fast path of prefill and decode alike.

Each program owns a [K, BV] slice of one (sequence, head) state in float32 registers, reads it
once, applies the sequence's tokens in order and writes it once. Per token: a^T S over the slice's
columns (a reduction over K only, so splitting V over programs is exact), then
S <- diag(exp(w)) S + b (a^T S) + k v^T and o = S^T (r * scale). Splitting V keeps the slice in
registers (64 x 32 floats over 4 warps at RWKV-7's 64-wide heads) and gives enough programs to
fill the GPU at small batch; each token's vectors are loaded while the token before it is applied.

Prefill through this kernel walks its tokens one after the other in each program, which is exact
but latency-bound on long prompts (38.6 ms for 32768 tokens of RWKV-7 2.9B on an H100,
2026-12-05); prefill therefore runs the chunked (DPLR) form of ops/rwkv7/chunk.py unless its
``PREFILL_CHUNKED`` is off. The task's cases straddle 16- and 64-token chunks so that a chunked
candidate is tested at its boundaries.
"""
from typing import Optional, Tuple

import torch

from ..gated_delta.layout import TokenHeads, scan_outputs
from ...triton_rows import whole_tiles

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

MAX_KEY_DIM = 128  # a whole key column of the state slice lives in registers
# State columns per program and warps per program (one warp would keep the two reductions over K
# per token inside the warp; narrower slices give one long sequence more programs); module-level
# so that ``python3 -m benchmarks scan_tiles rwkv7`` can sweep them
BLOCK_V = 32
WARPS = 4


def recurrent_forward(r: TokenHeads, w: TokenHeads, k: TokenHeads, v: TokenHeads, a: TokenHeads, b: TokenHeads,
                      scale: float, initial_state: Optional[torch.Tensor], cu_seqlens: torch.Tensor,
                      output_final_state: bool) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    t, heads, vd = v.tensor.shape
    kd = k.tensor.shape[-1]
    n = cu_seqlens.numel() - 1
    o, final, nothing = scan_outputs(v, kd, n, initial_state, output_final_state)
    if nothing:  # (with no token, the kernel's prefetch would read one that does not exist)
        return o, final
    block_k = triton.next_power_of_2(kd)
    # The interpreter costs per program, not per element: one program per (sequence, head) there.
    block_v = triton.next_power_of_2(vd) if whole_tiles() else min(BLOCK_V, triton.next_power_of_2(vd))
    h0 = initial_state
    _recurrent_kernel[(triton.cdiv(vd, block_v), n * heads)](
        r.tensor, w.tensor, k.tensor, v.tensor, a.tensor, b.tensor, o,
        h0 if h0 is not None else o, final if final is not None else o, cu_seqlens, scale,
        r.token_stride, r.head_stride, w.token_stride, w.head_stride, k.token_stride, k.head_stride,
        v.token_stride, v.head_stride, a.token_stride, a.head_stride, b.token_stride, b.head_stride,
        H=heads, K=kd, V=vd, BK=block_k, BV=block_v, HAS_H0=h0 is not None, STORE_FINAL=final is not None,
        num_warps=WARPS)
    return o, final


if triton is not None:

    @triton.jit
    def _token(r, w, k, v, a, b, t, eos, i_h, offs_k, offs_v, mask_k, mask_v,
               sr_t, sr_h, sw_t, sw_h, sk_t, sk_h, sv_t, sv_h, sa_t, sa_h, sb_t, sb_h):
        """Token t's (r, w, k, v, a, b) in float32. Past the sequence's end (the prefetch after its last
        token, or an empty sequence) it reads a token of the batch that is never used."""
        t = tl.maximum(tl.minimum(t, eos - 1), 0)
        b_r = tl.load(r + t * sr_t + i_h * sr_h + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        b_w = tl.load(w + t * sw_t + i_h * sw_h + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        b_k = tl.load(k + t * sk_t + i_h * sk_h + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        b_v = tl.load(v + t * sv_t + i_h * sv_h + offs_v, mask=mask_v, other=0.0).to(tl.float32)
        b_a = tl.load(a + t * sa_t + i_h * sa_h + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        b_b = tl.load(b + t * sb_t + i_h * sb_h + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        return b_r, b_w, b_k, b_v, b_a, b_b

    @triton.jit
    def _recurrent_kernel(r, w, k, v, a, b, o, h0, final, cu_seqlens, scale,
                          sr_t, sr_h, sw_t, sw_h, sk_t, sk_h, sv_t, sv_h, sa_t, sa_h, sb_t, sb_h,
                          H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                          HAS_H0: tl.constexpr, STORE_FINAL: tl.constexpr):
        i_v, i_nh = tl.program_id(0), tl.program_id(1)
        i_n, i_h = i_nh // H, i_nh % H
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
        offs_k = tl.arange(0, BK)
        offs_v = i_v * BV + tl.arange(0, BV)
        mask_k, mask_v = offs_k < K, offs_v < V
        mask_h = mask_k[:, None] & mask_v[None, :]
        tile = i_nh.to(tl.int64) * K * V + offs_k[:, None] * V + offs_v[None, :]
        h = tl.zeros((BK, BV), dtype=tl.float32)
        if HAS_H0:
            h = tl.load(h0 + tile, mask=mask_h, other=0.0)
        # the token's vectors are loaded one token ahead: they do not depend on the state, so the
        # next token's loads are in flight while this token's reductions and update run
        # (masked key rows load 0 everywhere, w too: exp(0) = 1 keeps the zero rows zero)
        nxt = _token(r, w, k, v, a, b, bos, eos, i_h, offs_k, offs_v, mask_k, mask_v,
                     sr_t, sr_h, sw_t, sw_h, sk_t, sk_h, sv_t, sv_h, sa_t, sa_h, sb_t, sb_h)
        for t in range(bos, eos):
            b_r, b_w, b_k, b_v, b_a, b_b = nxt
            nxt = _token(r, w, k, v, a, b, t + 1, eos, i_h, offs_k, offs_v, mask_k, mask_v,
                         sr_t, sr_h, sw_t, sw_h, sk_t, sk_h, sv_t, sv_h, sa_t, sa_h, sb_t, sb_h)
            removed = tl.sum(h * b_a[:, None], 0)  # a^T S, read before this token's decay
            h = h * tl.exp(b_w)[:, None] + b_b[:, None] * removed[None, :] + b_k[:, None] * b_v[None, :]
            b_o = tl.sum(h * (b_r * scale)[:, None], 0)
            tl.store(o + (t * H + i_h) * V + offs_v, b_o.to(o.dtype.element_ty), mask=mask_v)
        if STORE_FINAL:
            tl.store(final + tile, h, mask=mask_h)
