"""Token-by-token Triton kernel of gated linear attention: the decode path.

A decode step brings one token per sequence, so the op is a pure state stream: each program owns a
[K, BV] slice of one (sequence, head) state in float32 registers, reads it once, applies the
sequence's tokens in order (decay each key row by exp(g), add k v^T, read o = S^T q) and writes it
once. Splitting V over programs keeps the slice in registers (256 x 32 floats over 4 warps for
GLA-1.3B's 256 x 512 heads) and gives enough programs to cover the GPU at small batch.
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


def recurrent_forward(q: TokenHeads, k: TokenHeads, v: TokenHeads, g: TokenHeads, scale: float,
                      initial_state: Optional[torch.Tensor], cu_seqlens: torch.Tensor, output_final_state: bool
                      ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    t, heads, vd = v.tensor.shape
    kd = k.tensor.shape[-1]
    n = cu_seqlens.numel() - 1
    o, final, nothing = scan_outputs(v, kd, n, initial_state, output_final_state)
    if nothing:
        return o, final
    block_k = triton.next_power_of_2(kd)
    block_v = triton.next_power_of_2(vd) if whole_tiles() else min(32, triton.next_power_of_2(vd))
    h0 = initial_state
    _recurrent_kernel[(triton.cdiv(vd, block_v), n * heads)](
        q.tensor, k.tensor, v.tensor, g.tensor, o, h0 if h0 is not None else o, final if final is not None else o,
        cu_seqlens, scale, q.token_stride, q.head_stride, k.token_stride, k.head_stride,
        v.token_stride, v.head_stride, g.token_stride, g.head_stride,
        H=heads, K=kd, V=vd, BK=block_k, BV=block_v, HAS_H0=h0 is not None, STORE_FINAL=final is not None,
        num_warps=4)
    return o, final


if triton is not None:

    @triton.jit
    def _recurrent_kernel(q, k, v, g, o, h0, final, cu_seqlens, scale,
                          sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sg_t, sg_h,
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
        for t in range(bos, eos):
            b_q = tl.load(q + t * sq_t + i_h * sq_h + offs_k, mask=mask_k, other=0.0).to(tl.float32)
            b_k = tl.load(k + t * sk_t + i_h * sk_h + offs_k, mask=mask_k, other=0.0).to(tl.float32)
            b_g = tl.load(g + t * sg_t + i_h * sg_h + offs_k, mask=mask_k, other=0.0).to(tl.float32)
            b_v = tl.load(v + t * sv_t + i_h * sv_h + offs_v, mask=mask_v, other=0.0).to(tl.float32)
            h = h * tl.exp(b_g)[:, None] + b_k[:, None] * b_v[None, :]
            b_o = tl.sum(h * (b_q * scale)[:, None], 0)
            tl.store(o + (t * H + i_h) * V + offs_v, b_o.to(o.dtype.element_ty), mask=mask_v)
        if STORE_FINAL:
            tl.store(final + tile, h, mask=mask_h)
