"""Token-by-token Triton kernel of the gated delta rule: the decode path.

A decode step brings one token per sequence, so the op is a pure state stream: each program owns a
[K, BV] slice of one (sequence, value head) state in float32 registers, reads it once, applies the
sequence's tokens in order and writes it once. Splitting V over programs keeps the slice in
registers (128 x 32 floats over 4 warps) and gives enough programs to cover the GPU at small batch.
"""
from typing import Optional, Tuple

import torch

from ...triton_rows import whole_tiles
from .layout import TokenHeads, scan_outputs

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None


def recurrent_forward(q: TokenHeads, k: TokenHeads, v: TokenHeads, g: TokenHeads, beta: TokenHeads, scale: float,
                      initial_state: Optional[torch.Tensor], cu_seqlens: torch.Tensor, output_final_state: bool,
                      use_qk_l2norm: bool) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    t, hv, vd = v.tensor.shape
    kd = k.tensor.shape[-1]
    n = cu_seqlens.numel() - 1
    o, final, nothing = scan_outputs(v, kd, n, initial_state, output_final_state)
    if nothing:
        return o, final
    block_k = triton.next_power_of_2(kd)
    block_v = triton.next_power_of_2(vd) if whole_tiles() else min(32, triton.next_power_of_2(vd))
    h0 = initial_state
    _recurrent_kernel[(triton.cdiv(vd, block_v), n * hv)](
        q.tensor, k.tensor, v.tensor, g.tensor, beta.tensor, o,
        h0 if h0 is not None else o, final if final is not None else o, cu_seqlens, scale,
        q.token_stride, q.head_stride, k.token_stride, k.head_stride, v.token_stride, v.head_stride,
        g.token_stride, g.head_stride, beta.token_stride, beta.head_stride,
        HV=hv, GROUP=hv // k.tensor.shape[1], K=kd, V=vd, BK=block_k, BV=block_v,
        USE_L2NORM=use_qk_l2norm, HAS_H0=h0 is not None, STORE_HT=final is not None, num_warps=4)
    return o, final


if triton is not None:

    @triton.jit
    def _recurrent_kernel(q, k, v, g, beta, o, h0, ht, cu_seqlens, scale,
                          sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sg_t, sg_h, sb_t, sb_h,
                          HV: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                          BK: tl.constexpr, BV: tl.constexpr, USE_L2NORM: tl.constexpr,
                          HAS_H0: tl.constexpr, STORE_HT: tl.constexpr):
        i_v, i_nh = tl.program_id(0), tl.program_id(1)
        i_n, i_hv = i_nh // HV, i_nh % HV
        i_hk = i_hv // GROUP
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
        offs_k = tl.arange(0, BK)
        offs_v = i_v * BV + tl.arange(0, BV)
        mask_k, mask_v = offs_k < K, offs_v < V
        mask_h = mask_k[:, None] & mask_v[None, :]
        state_offs = i_nh.to(tl.int64) * K * V + offs_k[:, None] * V + offs_v[None, :]
        h = tl.zeros((BK, BV), dtype=tl.float32)
        if HAS_H0:
            h = tl.load(h0 + state_offs, mask=mask_h, other=0.0).to(tl.float32)
        for t in range(bos, eos):
            b_q = tl.load(q + t * sq_t + i_hk * sq_h + offs_k, mask=mask_k, other=0.0).to(tl.float32)
            b_k = tl.load(k + t * sk_t + i_hk * sk_h + offs_k, mask=mask_k, other=0.0).to(tl.float32)
            b_v = tl.load(v + t * sv_t + i_hv * sv_h + offs_v, mask=mask_v, other=0.0).to(tl.float32)
            b_g = tl.load(g + t * sg_t + i_hv * sg_h).to(tl.float32)
            b_beta = tl.load(beta + t * sb_t + i_hv * sb_h).to(tl.float32)
            if USE_L2NORM:
                b_q = b_q * tl.rsqrt(tl.sum(b_q * b_q) + 1e-6)
                b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k) + 1e-6)
            h = h * tl.exp(b_g)
            delta = b_beta * (b_v - tl.sum(h * b_k[:, None], 0))
            h = h + b_k[:, None] * delta[None, :]
            b_o = tl.sum(h * (b_q * scale)[:, None], 0)
            tl.store(o + (t * HV + i_hv) * V + offs_v, b_o.to(o.dtype.element_ty), mask=mask_v)
        if STORE_HT:
            tl.store(ht + state_offs, h, mask=mask_h)
