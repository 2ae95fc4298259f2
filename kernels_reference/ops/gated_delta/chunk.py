"""Chunked Triton kernels of the gated delta rule: the prefill path.

Within a chunk of BT = 64 tokens the recurrence is linear in the state it starts from, S0. With the
cumulative log-decay b_t = g_1 + ... + g_t inside the chunk, the corrections v'_t solve a unit lower
triangular system

    (I + A) V' = diag(beta) V - diag(beta * exp(b)) K S0,   A[t, s] = beta_t exp(b_t - b_s) k_t.k_s  (s < t)

so with T = (I + A)^-1 (the "UT transform"), V' = U - W S0 where U = T diag(beta) V and
W = T diag(beta exp(b)) K depend only on the chunk's own tokens. Then

    O   = diag(exp(b)) Q S0 + tril(Q K^T * exp(b_t - b_s)) V'
    S_L = exp(b_L) S0 + (K * exp(b_L - b))^T V'

Every exponent is <= 0 (g <= 0), so nothing overflows.

Three kernels; only the middle one walks a sequence's chunks in order:
* ``_chunk_wy_kernel``, one program per (chunk, value head), all chunks in parallel: b, A, the
  inverse of I + A in float32 by blocks of 16 tokens (substitution inside the diagonal blocks,
  block products below them), then W and U.
* ``_chunk_states_kernel``, one program per (sequence, value head, V block): carries the state in
  float32 registers from chunk to chunk, storing the state each chunk starts from and the chunk's
  V' (over U, which nothing reads after it). Per chunk it does the two products the recurrence
  needs (W S0 and K^T V') and nothing else: this loop is the prefill's critical path, and at one
  long sequence it has only Hv * V / BV programs to spread over the GPU.
* ``_chunk_output_kernel``, one program per (chunk, value head, V block), all chunks in parallel:
  O from the stored S0 and V'.

The stored S0 and V' are kept in the input dtype: they are only read as matmul operands, which are
rounded to that dtype anyway. Matrix products take their operands in the input dtype (bf16: tensor
cores) with float32 accumulation, as production kernels do; the state, the decays, the triangular
solve and the normalisation stay float32.
"""
from typing import Optional, Tuple

import torch

from ...triton_rows import whole_tiles
from .layout import (TokenHeads, chunk_is_empty, chunk_rows, chunked_scan_start, mm as _mm, store_rows,
                     tile as _tile, walk_start)

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

CHUNK = 64
# V columns per program of the state pass and the output kernel. The state pass walks a sequence's
# chunks in order, so one long sequence has only Hv * V / STATE_BLOCK_V programs: 32-wide blocks
# give Qwen3-Next's 32 value heads 128 programs for an H100's 132 SMs, where 64-wide ones gave 64.
# The output kernel's programs are all parallel, and a whole 128-wide head per program reads q, k
# and the chunk's start state once instead of twice. On an H100 on 2026-12-07 (``python3 -m benchmarks
# scan_tiles gated_delta_rule``, docs/perf/h100-2026-12-07b.md), on the 32768-token prefill: state
# pass 1548 -> 1256 us (32 wide), output 805 -> 681 us (128 wide); then the prefill at 1.09-1.12 of
# fla-core against 0.938 at 64 / 64. (32-wide blocks faulted on an H200 with Triton 3.6 on 2026-12-04
# in an earlier kernel that did the state pass and the output in one loop; this state pass at 32
# wide passed the task's GPU correctness and fuzz tests the same day as the timing.)
STATE_BLOCK_V = 32
# Whether the state pass loads each next chunk's tiles a step ahead, by hand (what took Mamba-2's
# serial state pass from 1131 to 174 us on an H100; here two chunks' W, U and keys at K = 128 are
# many registers). Off: on an H100 (2026-12-06, ``python3 -m benchmarks scan_tiles gated_delta_rule``)
# it slowed the state pass of the 32768-token case from 1538 to 2590 us.
STATE_PREFETCH = False
OUTPUT_BLOCK_V = 128
# Warps per program of the three kernels and the state pass's pipeline stages, module-level so that
# ``python3 -m benchmarks scan_tiles gated_delta_rule`` can sweep them with the blocks above.
WY_WARPS, STATE_WARPS, STATE_STAGES, OUTPUT_WARPS = 4, 4, 2, 4
# The WY kernel forms W = T X and U = T Y by 16-row block products. Whole-chunk products (T's
# blocks joined into one 64 x 64 tile) and A from one 64 x 64 product of the keys cut into blocks
# were tried and timed on an H100 on 2026-12-06 (``python3 -m benchmarks scan_tiles
# gated_delta_rule``, docs/perf/h100-2026-12-06.md): the kernel went from 1432 to 1971 and 3192 us on
# the 32768-token Qwen3-Next prefill, so neither is kept.


def chunk_forward(q: TokenHeads, k: TokenHeads, v: TokenHeads, g: TokenHeads, beta: TokenHeads, scale: float,
                  initial_state: Optional[torch.Tensor], cu_seqlens: torch.Tensor, output_final_state: bool,
                  use_qk_l2norm: bool) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    t, hv, vd = v.tensor.shape
    hk, kd = k.tensor.shape[1], k.tensor.shape[-1]
    n = cu_seqlens.numel() - 1
    device, dtype = v.tensor.device, v.tensor.dtype
    o, final, layout, dot = chunked_scan_start(v, kd, cu_seqlens, initial_state, output_final_state, CHUNK)
    if layout is None:
        return o, final
    chunks = layout.table.shape[0]
    whole = whole_tiles()
    block_k = triton.next_power_of_2(kd)
    block_v_all = triton.next_power_of_2(vd)
    # The interpreter pays per program and per op, not per element: whole heads per program there.
    state_bv = block_v_all if whole else min(block_v_all, STATE_BLOCK_V)
    output_bv = block_v_all if whole else min(block_v_all, OUTPUT_BLOCK_V)
    group = hv // hk
    heads = dict(HV=hv, GROUP=group, K=kd, V=vd, BT=CHUNK, BK=block_k, USE_L2NORM=use_qk_l2norm)

    w = torch.empty((t, hv, kd), dtype=dtype, device=device)
    u = torch.empty((t, hv, vd), dtype=dtype, device=device)  # U, then V' in place
    b = torch.empty((t, hv), dtype=torch.float32, device=device)
    _chunk_wy_kernel[(chunks, hv)](
        k.tensor, v.tensor, g.tensor, beta.tensor, w, u, b, layout.table,
        k.token_stride, k.head_stride, v.token_stride, v.head_stride,
        g.token_stride, g.head_stride, beta.token_stride, beta.head_stride,
        BV=block_v_all if whole else min(64, block_v_all), **heads, **dot, num_warps=WY_WARPS)

    starts = torch.empty((chunks, hv, kd, vd), dtype=dtype, device=device)
    h0 = initial_state
    _chunk_states_kernel[(triton.cdiv(vd, state_bv), n * hv)](
        k.tensor, w, u, b, starts, h0 if h0 is not None else b, final if final is not None else b,
        cu_seqlens, layout.first_chunk, k.token_stride, k.head_stride,
        BV=state_bv, HAS_H0=h0 is not None, STORE_HT=final is not None, PREFETCH=STATE_PREFETCH, **heads, **dot,
        num_warps=STATE_WARPS, num_stages=STATE_STAGES)

    _chunk_output_kernel[(triton.cdiv(vd, output_bv), chunks, hv)](
        q.tensor, k.tensor, u, b, starts, o, layout.table, scale,
        q.token_stride, q.head_stride, k.token_stride, k.head_stride,
        BV=output_bv, **heads, **dot, num_warps=OUTPUT_WARPS)
    return o, final


if triton is not None:

    @triton.jit
    def _unit_lower_inverse(a, BC: tl.constexpr):
        """(I + a)^-1 for a strictly lower triangular [BC, BC] float32 tile, row by row: row i of
        the inverse is e_i minus a[i, :j<i] times the rows above it (already final)."""
        r = tl.arange(0, BC)
        inv = (r[:, None] == r[None, :]).to(tl.float32)
        for i in tl.static_range(1, BC):
            a_row = tl.sum(tl.where(r[:, None] == i, a, 0.0), 0)
            correction = tl.sum(a_row[:, None] * inv, 0)
            inv = tl.where(r[:, None] == i, inv - correction[None, :], inv)
        return inv

    @triton.jit
    def _f32_mm(a, b):
        return tl.dot(a, b, input_precision="ieee")

    @triton.jit
    def _l2_rows(x):
        return x * tl.rsqrt(tl.sum(x * x, 1) + 1e-6)[:, None]

    @triton.jit
    def _key_tile(k, rows, row_ok, sk_t, sk_h, i_hk, offs_k, K: tl.constexpr, USE_L2NORM: tl.constexpr):
        b_k = _tile(k, rows, row_ok, sk_t, i_hk * sk_h, offs_k, K)
        if USE_L2NORM:
            b_k = _l2_rows(b_k)
        return b_k

    @triton.jit
    def _sub_chunk(k, g, beta, start, end, i: tl.constexpr, i_hk, i_hv, offset, sk_t, sk_h, sg_t, sg_h, sb_t, sb_h,
                   K: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, USE_L2NORM: tl.constexpr):
        """Sub-chunk i's rows: its keys [BC, BK] (normalised), the chunk's cumulative log decay at
        each row (``offset``: the decay summed over the sub-chunks before it) and beta."""
        rows = start + i * BC + tl.arange(0, BC)
        ok = rows < end
        b_k = _key_tile(k, rows, ok, sk_t, sk_h, i_hk, tl.arange(0, BK), K, USE_L2NORM)
        b_g = tl.load(g + rows.to(tl.int64) * sg_t + i_hv * sg_h, mask=ok, other=0.0).to(tl.float32)
        b_beta = tl.load(beta + rows.to(tl.int64) * sb_t + i_hv * sb_h, mask=ok, other=0.0).to(tl.float32)
        return rows, ok, b_k, offset + tl.cumsum(b_g, 0), offset + tl.sum(b_g, 0), b_beta

    @triton.jit
    def _a_block(k_i, cum_i, beta_i, k_j, cum_j, DIAGONAL: tl.constexpr, BC: tl.constexpr,
                 DOT_T: tl.constexpr, EMULATE: tl.constexpr):
        """A's block of sub-chunk rows i and columns j <= i: beta_t exp(b_t - b_s) k_t.k_s, strictly
        below the diagonal (every exponent <= 0: s comes before t)."""
        kk = _mm(k_i, tl.trans(k_j), DOT_T, EMULATE)
        gap = cum_i[:, None] - cum_j[None, :]
        if DIAGONAL:
            r = tl.arange(0, BC)
            below = r[:, None] > r[None, :]
            return tl.where(below, kk * tl.exp(tl.where(below, gap, 0.0)) * beta_i[:, None], 0.0)
        return kk * tl.exp(gap) * beta_i[:, None]

    @triton.jit
    def _chunk_wy_kernel(k, v, g, beta, w, u, b, table,
                         sk_t, sk_h, sv_t, sv_h, sg_t, sg_h, sb_t, sb_h,
                         HV: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                         BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, USE_L2NORM: tl.constexpr,
                         DOT_T: tl.constexpr, EMULATE: tl.constexpr):
        """(I + A)^-1 by blocks of 16 tokens: the four diagonal blocks inverted by substitution
        (16 steps on 16 x 16 tiles, where the whole 64 x 64 tile took 63 steps of reductions over
        4096 entries), the blocks below them by block forward substitution,
        T_ij = -T_ii sum_{j <= m < i} A_im T_mj. Then W and U by row block, W_i = sum_j T_ij X_j."""
        tl.static_assert(BT == 64)
        BC: tl.constexpr = 16
        i_c, i_hv = tl.program_id(0), tl.program_id(1)
        start = tl.load(table + 2 * i_c)
        end = tl.load(table + 2 * i_c + 1)
        if end <= start:  # past the real chunk count (chunk_is_empty)
            return
        i_hk = i_hv // GROUP
        r0, ok0, k0, c0, s0, be0 = _sub_chunk(k, g, beta, start, end, 0, i_hk, i_hv, 0.0, sk_t, sk_h, sg_t, sg_h,
                                              sb_t, sb_h, K, BC, BK, USE_L2NORM)
        r1, ok1, k1, c1, s1, be1 = _sub_chunk(k, g, beta, start, end, 1, i_hk, i_hv, s0, sk_t, sk_h, sg_t, sg_h,
                                              sb_t, sb_h, K, BC, BK, USE_L2NORM)
        r2, ok2, k2, c2, s2, be2 = _sub_chunk(k, g, beta, start, end, 2, i_hk, i_hv, s1, sk_t, sk_h, sg_t, sg_h,
                                              sb_t, sb_h, K, BC, BK, USE_L2NORM)
        r3, ok3, k3, c3, s3, be3 = _sub_chunk(k, g, beta, start, end, 3, i_hk, i_hv, s2, sk_t, sk_h, sg_t, sg_h,
                                              sb_t, sb_h, K, BC, BK, USE_L2NORM)
        tl.store(b + r0.to(tl.int64) * HV + i_hv, c0, mask=ok0)
        tl.store(b + r1.to(tl.int64) * HV + i_hv, c1, mask=ok1)
        tl.store(b + r2.to(tl.int64) * HV + i_hv, c2, mask=ok2)
        tl.store(b + r3.to(tl.int64) * HV + i_hv, c3, mask=ok3)

        t00 = _unit_lower_inverse(_a_block(k0, c0, be0, k0, c0, True, BC, DOT_T, EMULATE), BC)
        t11 = _unit_lower_inverse(_a_block(k1, c1, be1, k1, c1, True, BC, DOT_T, EMULATE), BC)
        t22 = _unit_lower_inverse(_a_block(k2, c2, be2, k2, c2, True, BC, DOT_T, EMULATE), BC)
        t33 = _unit_lower_inverse(_a_block(k3, c3, be3, k3, c3, True, BC, DOT_T, EMULATE), BC)
        a10 = _a_block(k1, c1, be1, k0, c0, False, BC, DOT_T, EMULATE)
        a20 = _a_block(k2, c2, be2, k0, c0, False, BC, DOT_T, EMULATE)
        a21 = _a_block(k2, c2, be2, k1, c1, False, BC, DOT_T, EMULATE)
        a30 = _a_block(k3, c3, be3, k0, c0, False, BC, DOT_T, EMULATE)
        a31 = _a_block(k3, c3, be3, k1, c1, False, BC, DOT_T, EMULATE)
        a32 = _a_block(k3, c3, be3, k2, c2, False, BC, DOT_T, EMULATE)
        t10 = -_f32_mm(t11, _f32_mm(a10, t00))
        t21 = -_f32_mm(t22, _f32_mm(a21, t11))
        t20 = -_f32_mm(t22, _f32_mm(a20, t00) + _f32_mm(a21, t10))
        t32 = -_f32_mm(t33, _f32_mm(a32, t22))
        t31 = -_f32_mm(t33, _f32_mm(a31, t11) + _f32_mm(a32, t21))
        t30 = -_f32_mm(t33, _f32_mm(a30, t00) + _f32_mm(a31, t10) + _f32_mm(a32, t20))

        offs_k = tl.arange(0, BK)
        x0 = k0 * (be0 * tl.exp(c0))[:, None]
        x1 = k1 * (be1 * tl.exp(c1))[:, None]
        x2 = k2 * (be2 * tl.exp(c2))[:, None]
        x3 = k3 * (be3 * tl.exp(c3))[:, None]
        store_rows(w, r0, ok0, HV, i_hv, offs_k, K, _mm(t00, x0, DOT_T, EMULATE))
        store_rows(w, r1, ok1, HV, i_hv, offs_k, K, _mm(t10, x0, DOT_T, EMULATE) + _mm(t11, x1, DOT_T, EMULATE))
        store_rows(w, r2, ok2, HV, i_hv, offs_k, K, _mm(t20, x0, DOT_T, EMULATE) + _mm(t21, x1, DOT_T, EMULATE)
                    + _mm(t22, x2, DOT_T, EMULATE))
        store_rows(w, r3, ok3, HV, i_hv, offs_k, K, _mm(t30, x0, DOT_T, EMULATE) + _mm(t31, x1, DOT_T, EMULATE)
                    + _mm(t32, x2, DOT_T, EMULATE) + _mm(t33, x3, DOT_T, EMULATE))
        for i_v in range(0, tl.cdiv(V, BV)):
            offs_v = i_v * BV + tl.arange(0, BV)
            y0 = _tile(v, r0, ok0, sv_t, i_hv * sv_h, offs_v, V) * be0[:, None]
            y1 = _tile(v, r1, ok1, sv_t, i_hv * sv_h, offs_v, V) * be1[:, None]
            y2 = _tile(v, r2, ok2, sv_t, i_hv * sv_h, offs_v, V) * be2[:, None]
            y3 = _tile(v, r3, ok3, sv_t, i_hv * sv_h, offs_v, V) * be3[:, None]
            store_rows(u, r0, ok0, HV, i_hv, offs_v, V, _mm(t00, y0, DOT_T, EMULATE))
            store_rows(u, r1, ok1, HV, i_hv, offs_v, V, _mm(t10, y0, DOT_T, EMULATE) + _mm(t11, y1, DOT_T, EMULATE))
            store_rows(u, r2, ok2, HV, i_hv, offs_v, V, _mm(t20, y0, DOT_T, EMULATE)
                        + _mm(t21, y1, DOT_T, EMULATE) + _mm(t22, y2, DOT_T, EMULATE))
            store_rows(u, r3, ok3, HV, i_hv, offs_v, V, _mm(t30, y0, DOT_T, EMULATE) + _mm(t31, y1, DOT_T, EMULATE)
                        + _mm(t32, y2, DOT_T, EMULATE) + _mm(t33, y3, DOT_T, EMULATE))

    @triton.jit
    def _state_step_tiles(k, w, u, b, start, eos, sk_t, sk_h, i_hk, i_hv, offs_k, offs_v,
                          HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                          USE_L2NORM: tl.constexpr):
        """What the state pass reads of the chunk at ``start`` (nothing past ``eos``: zeros): W, U,
        the keys decayed to the chunk's end and the chunk's decay e^{b_last}."""
        rows = start + tl.arange(0, BT)
        row_ok = rows < eos
        out_rows = rows.to(tl.int64)[:, None] * HV + i_hv
        b_w = tl.load(w + out_rows * K + offs_k[None, :], mask=row_ok[:, None] & (offs_k < K)[None, :], other=0.0)
        b_u = tl.load(u + out_rows * V + offs_v[None, :], mask=row_ok[:, None] & (offs_v < V)[None, :],
                      other=0.0).to(tl.float32)
        b_k = _key_tile(k, rows, row_ok, sk_t, sk_h, i_hk, offs_k, K, USE_L2NORM)
        b_cum = tl.load(b + rows.to(tl.int64) * HV + i_hv, mask=row_ok, other=0.0)
        last = tl.maximum(tl.minimum(start + BT, eos) - 1, 0)
        b_last = tl.load(b + last.to(tl.int64) * HV + i_hv)
        # rows past the chunk have k = 0; their exponent b_last - 0 <= 0 cannot overflow
        return b_w, b_u, b_k * tl.exp(b_last - b_cum)[:, None], tl.exp(b_last)

    @triton.jit
    def _chunk_states_kernel(k, w, u, b, starts, h0, ht, cu_seqlens, first_chunk, sk_t, sk_h,
                             HV: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                             BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                             USE_L2NORM: tl.constexpr, HAS_H0: tl.constexpr, STORE_HT: tl.constexpr,
                             PREFETCH: tl.constexpr, DOT_T: tl.constexpr, EMULATE: tl.constexpr):
        i_v, i_nh = tl.program_id(0), tl.program_id(1)
        i_n, i_hv = i_nh // HV, i_nh % HV
        i_hk = i_hv // GROUP
        offs_k = tl.arange(0, BK)
        offs_v = i_v * BV + tl.arange(0, BV)
        mask_k, mask_v = offs_k < K, offs_v < V
        mask_h = mask_k[:, None] & mask_v[None, :]
        state_tile = offs_k[:, None] * V + offs_v[None, :]
        bos, eos, chunk, h = walk_start(h0, cu_seqlens, first_chunk, i_n, i_nh, state_tile, mask_h, K, V, BK, BV,
                                        HAS_H0)
        r = tl.arange(0, BT)
        if PREFETCH:  # the first chunk's tiles before the loop, then each next chunk's a step ahead
            b_w, b_u, k_to_end, decay = _state_step_tiles(k, w, u, b, bos, eos, sk_t, sk_h, i_hk, i_hv, offs_k,
                                                          offs_v, HV, K, V, BT, USE_L2NORM)
        for start in range(bos, eos, BT):
            if PREFETCH:
                # in flight while this chunk's dependent products run (the pass is latency-bound)
                n_w, n_u, n_k_to_end, n_decay = _state_step_tiles(k, w, u, b, start + BT, eos, sk_t, sk_h, i_hk,
                                                                  i_hv, offs_k, offs_v, HV, K, V, BT, USE_L2NORM)
            else:
                b_w, b_u, k_to_end, decay = _state_step_tiles(k, w, u, b, start, eos, sk_t, sk_h, i_hk, i_hv,
                                                              offs_k, offs_v, HV, K, V, BT, USE_L2NORM)
            tl.store(starts + (chunk * HV + i_hv) * K * V + state_tile, h.to(starts.dtype.element_ty), mask=mask_h)
            rows = start + r
            row_ok = rows < eos
            v_new = b_u - _mm(b_w, h, DOT_T, EMULATE)  # the chunk's corrections V' = U - W S0
            tl.store(u + (rows.to(tl.int64)[:, None] * HV + i_hv) * V + offs_v[None, :], v_new.to(u.dtype.element_ty),
                     mask=row_ok[:, None] & mask_v[None, :])
            h = h * decay + _mm(tl.trans(k_to_end), v_new, DOT_T, EMULATE)
            if PREFETCH:
                b_w, b_u, k_to_end, decay = n_w, n_u, n_k_to_end, n_decay
            chunk += 1
        if STORE_HT:
            tl.store(ht + i_nh.to(tl.int64) * K * V + state_tile, h, mask=mask_h)

    @triton.jit
    def _chunk_output_kernel(q, k, v_new, b, starts, o, table, scale, sq_t, sq_h, sk_t, sk_h,
                             HV: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                             BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, USE_L2NORM: tl.constexpr,
                             DOT_T: tl.constexpr, EMULATE: tl.constexpr):
        i_v, i_c, i_hv = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        if chunk_is_empty(table, i_c):
            return
        i_hk = i_hv // GROUP
        rows, row_ok = chunk_rows(table, i_c, BT)
        r = tl.arange(0, BT)
        offs_k = tl.arange(0, BK)
        offs_v = i_v * BV + tl.arange(0, BV)
        mask_k, mask_v = offs_k < K, offs_v < V
        b_q = _key_tile(q, rows, row_ok, sq_t, sq_h, i_hk, offs_k, K, USE_L2NORM) * scale
        b_k = _key_tile(k, rows, row_ok, sk_t, sk_h, i_hk, offs_k, K, USE_L2NORM)
        b_cum = tl.load(b + rows.to(tl.int64) * HV + i_hv, mask=row_ok, other=0.0)
        # rows past the chunk's end read b = 0: kept out of the exponent, which would overflow
        causal = (r[:, None] >= r[None, :]) & row_ok[:, None]
        scores = _mm(b_q, tl.trans(b_k), DOT_T, EMULATE)
        scores = tl.where(causal, scores * tl.exp(tl.where(causal, b_cum[:, None] - b_cum[None, :], 0.0)), 0.0)
        b_h = tl.load(starts + (i_c.to(tl.int64) * HV + i_hv) * K * V + offs_k[:, None] * V + offs_v[None, :],
                      mask=mask_k[:, None] & mask_v[None, :], other=0.0)
        out_rows = rows.to(tl.int64)[:, None] * HV + i_hv
        b_v = tl.load(v_new + out_rows * V + offs_v[None, :], mask=row_ok[:, None] & mask_v[None, :], other=0.0)
        b_o = _mm(b_q * tl.exp(b_cum)[:, None], b_h, DOT_T, EMULATE) + _mm(scores, b_v, DOT_T, EMULATE)
        tl.store(o + out_rows * V + offs_v[None, :], b_o.to(o.dtype.element_ty),
                 mask=row_ok[:, None] & mask_v[None, :])
