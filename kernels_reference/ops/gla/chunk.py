"""Chunked Triton kernels of gated linear attention: the prefill path.

Split a sequence into chunks of BT = 64 tokens. With b_t = g_1 + ... + g_t the per-key-channel
cumulative log decay inside a chunk (a vector over K) and S0 the state the chunk starts from,

    o_t = (q_t * exp(b_t))^T S0 + sum_{s <= t} [sum_k q_tk k_sk exp(b_tk - b_sk)] v_s
    S_L = diag(exp(b_L)) S0 + sum_s (k_s * exp(b_L - b_s)) v_s^T

Every exponent above is <= 0 except the pairwise b_t - b_s when it is split into two factors: the
decay is per key channel, so the intra-chunk scores are no plain product Q K^T, and writing them as
(q_t e^{b_t}) . (k_s e^{-b_s}) overflows float32 once a channel decays by more than ~88 within the
chunk. The scores are therefore built a 16-token block of rows i at a time, both sides factored
around the block's first row n: (q_t e^{b_t - b_n}) . (k_s e^{b_n - b_s}) for every key s up to the
end of block i, one product on the tensor cores. For keys before n both exponents are <= 0; for
keys inside block i the key side's exponent is >= 0 but bounded by how much a channel decays across
16 tokens. A block whose decay exceeds DIAG_SAFE_NATS (far beyond trained gates: gla-1.3b's fastest
channels forget ~0.2 nats a token) has its diagonal block summed elementwise instead, with
exp(b_t - b_s) masked to s <= t, which is exact for any decay. (Before 2026-12-05 every diagonal
block was summed that way and each sub-chunk pair below it was a product of its own: 757 us of
scores on the 32k-token case on an H100, against 290 us now; docs/perf/h100-scan-tiles.md.)

Four kernels, all but the state pass parallel over chunks:
* ``_local_cumsum_kernel``: b within each chunk, float32 [T, H, K].
* ``_chunk_states_kernel``, one program per (sequence, head, K block, V block): walks the
  sequence's chunks in order with its state tile in float32 registers, stores the state each chunk
  starts from (in the operand dtype: it is only read as a matmul operand) and the final state.
* ``_intra_scores_kernel``, one program per (chunk, head): the causal scores A [BT, BT], float32.
* ``_chunk_output_kernel``, one program per (chunk, head, V block): o = (Q * e^b) S0 + A V.

Matrix products take their operands in the input dtype (bf16: tensor cores) with float32
accumulation, except the scores' products (float32 operands, TF32 on the GPU); decays,
cumulative sums and the carried state stay float32.
"""
from typing import Optional, Tuple

import torch

from ..gated_delta.layout import (TokenHeads, chunk_is_empty, chunk_rows, chunked_scan_start, mm as _mm,
                                  tile as _tile, walk_start)
from ...triton_rows import whole_tiles

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

CHUNK = 64
SUB_CHUNK = 16
# (K block, V block, warps, pipeline stages) of the serial state walk; module-level so that
# ``python3 -m benchmarks scan_tiles gated_linear_attention`` can sweep it
STATE_TILES = (32, 64, 4, 2)
# Whether the walk loads each next chunk's tiles a step ahead, by hand (what took Mamba-2's serial
# state pass from 1131 to 174 us on an H100). On since ``scan_tiles gated_linear_attention`` on an
# H100 (2026-12-06): the walk 1060 -> 845 us on the 32768-token case, same errors
# (docs/perf/h100-2026-12-06.md).
STATE_PREFETCH = True
# K step of the scores' diagonal sub-chunk blocks, summed elementwise over a [16, 16, DIAG_K] cube
DIAG_K = 32
# K step of the scores' products (one per 16-row block, against all the chunk's keys up to it)
ROWS_BK = 32
# The scores kernel factors a diagonal block's exp(b_t - b_s) around the block's first row n as
# exp(b_t - b_n) exp(b_n - b_s); the second factor is >= 1 and stays finite while every channel's
# decay across the 16 rows is under DIAG_SAFE_NATS. A block that decays faster is summed elementwise.
DIAG_SAFE_NATS = 40.0


def chunk_forward(q: TokenHeads, k: TokenHeads, v: TokenHeads, g: TokenHeads, scale: float,
                  initial_state: Optional[torch.Tensor], cu_seqlens: torch.Tensor, output_final_state: bool
                  ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    t, heads, vd = v.tensor.shape
    kd = k.tensor.shape[-1]
    n = cu_seqlens.numel() - 1
    device, dtype = v.tensor.device, v.tensor.dtype
    o, final, layout, dot = chunked_scan_start(v, kd, cu_seqlens, initial_state, output_final_state, CHUNK)
    if layout is None:
        return o, final
    chunks = layout.table.shape[0]
    whole = whole_tiles()  # the interpreter pays per program and per op: whole heads per program there
    bk = triton.next_power_of_2(kd) if whole else min(64, triton.next_power_of_2(kd))
    bv = triton.next_power_of_2(vd) if whole else min(64, triton.next_power_of_2(vd))

    b = torch.empty((t, heads, kd), dtype=torch.float32, device=device)
    _local_cumsum_kernel[(chunks, heads, triton.cdiv(kd, bk))](
        g.tensor, b, layout.table, g.token_stride, g.head_stride, H=heads, K=kd, BT=CHUNK, BK=bk, num_warps=4)

    states = torch.empty((chunks, heads, kd, vd), dtype=dtype, device=device)
    h0 = initial_state
    # the serial walk's state tile: narrower than the other kernels' so that one long sequence still
    # gives every SM several programs to hide its per-chunk load latency behind
    sk, sv, s_warps, s_stages = (bk, bv, 4, 2) if whole else STATE_TILES
    sk, sv = min(sk, bk), min(sv, bv)
    _chunk_states_kernel[(triton.cdiv(kd, sk), triton.cdiv(vd, sv), n * heads)](
        k.tensor, v.tensor, b, states, h0 if h0 is not None else b, final if final is not None else b,
        cu_seqlens, layout.first_chunk, k.token_stride, k.head_stride, v.token_stride, v.head_stride,
        H=heads, K=kd, V=vd, BT=CHUNK, BK=sk, BV=sv, HAS_H0=h0 is not None, STORE_FINAL=final is not None,
        PREFETCH=STATE_PREFETCH, **dot, num_warps=s_warps, num_stages=s_stages)

    scores = torch.empty((t, heads, CHUNK), dtype=torch.float32, device=device)
    precision = "ieee" if dot["EMULATE"] or dtype == torch.float32 else "tf32"
    bkd = bk if whole else min(DIAG_K, bk)
    _intra_scores_kernel[(chunks, heads)](
        q.tensor, k.tensor, b, scores, layout.table, scale,
        q.token_stride, q.head_stride, k.token_stride, k.head_stride,
        H=heads, K=kd, BT=CHUNK, BC=SUB_CHUNK, BK=bk if whole else min(ROWS_BK, bk), BKD=bkd,
        SAFE=DIAG_SAFE_NATS, PRECISION=precision, num_warps=4)

    _chunk_output_kernel[(triton.cdiv(vd, bv), chunks, heads)](
        q.tensor, v.tensor, b, states, scores, o, layout.table, scale,
        q.token_stride, q.head_stride, v.token_stride, v.head_stride,
        H=heads, K=kd, V=vd, BT=CHUNK, BK=bk, BV=bv, **dot, num_warps=4)
    return o, final


if triton is not None:

    @triton.jit
    def _local_cumsum_kernel(g, b, table, sg_t, sg_h, H: tl.constexpr, K: tl.constexpr,
                             BT: tl.constexpr, BK: tl.constexpr):
        i_c, i_h, i_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        if chunk_is_empty(table, i_c):
            return
        rows, row_ok = chunk_rows(table, i_c, BT)
        cols = i_k * BK + tl.arange(0, BK)
        b_g = _tile(g, rows, row_ok, sg_t, i_h * sg_h, cols, K)
        out = b + (rows.to(tl.int64)[:, None] * H + i_h) * K + cols[None, :]
        tl.store(out, tl.cumsum(b_g, 0), mask=row_ok[:, None] & (cols < K)[None, :])

    @triton.jit
    def _state_step_tiles(k, v, b, start, eos, sk_t, sk_h, sv_t, sv_h, i_h, offs_k, offs_v,
                          H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr):
        """What the state walk needs of the chunk at ``start`` (nothing past ``eos``: zeros): k
        decayed to the chunk's end, the chunk's decay e^{b_last} and its v rows."""
        rows = start + tl.arange(0, BT)
        row_ok = rows < eos
        last = tl.minimum(start + BT, eos) - 1
        b_b = _tile(b, rows, row_ok, H * K, i_h * K, offs_k, K)
        b_last = tl.load(b + (last.to(tl.int64) * H + i_h) * K + offs_k,
                         mask=offs_k < tl.where(start < eos, K, 0), other=0.0)
        b_k = _tile(k, rows, row_ok, sk_t, i_h * sk_h, offs_k, K)
        b_v = _tile(v, rows, row_ok, sv_t, i_h * sv_h, offs_v, V)
        # rows past the chunk have k = 0; their exponent b_last - 0 <= 0 cannot overflow
        return b_k * tl.exp(b_last[None, :] - b_b), tl.exp(b_last), b_v

    @triton.jit
    def _chunk_states_kernel(k, v, b, states, h0, final, cu_seqlens, first_chunk,
                             sk_t, sk_h, sv_t, sv_h,
                             H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                             BK: tl.constexpr, BV: tl.constexpr, HAS_H0: tl.constexpr, STORE_FINAL: tl.constexpr,
                             PREFETCH: tl.constexpr, DOT_T: tl.constexpr, EMULATE: tl.constexpr):
        i_k, i_v, i_nh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        i_n, i_h = i_nh // H, i_nh % H
        offs_k = i_k * BK + tl.arange(0, BK)
        offs_v = i_v * BV + tl.arange(0, BV)
        mask_k, mask_v = offs_k < K, offs_v < V
        mask_h = mask_k[:, None] & mask_v[None, :]
        tile = offs_k[:, None] * V + offs_v[None, :]
        bos, eos, chunk, h = walk_start(h0, cu_seqlens, first_chunk, i_n, i_nh, tile, mask_h, K, V, BK, BV, HAS_H0)
        if PREFETCH:  # the first chunk's tiles before the loop, then each next chunk's a step ahead
            k_to_end, decay, b_v = _state_step_tiles(k, v, b, bos, eos, sk_t, sk_h, sv_t, sv_h, i_h, offs_k, offs_v,
                                                     H, K, V, BT)
        for start in range(bos, eos, BT):
            if PREFETCH:
                # in flight while this chunk's update runs (the walk is latency-bound)
                n_k_to_end, n_decay, n_v = _state_step_tiles(k, v, b, start + BT, eos, sk_t, sk_h, sv_t, sv_h, i_h,
                                                             offs_k, offs_v, H, K, V, BT)
            else:
                k_to_end, decay, b_v = _state_step_tiles(k, v, b, start, eos, sk_t, sk_h, sv_t, sv_h, i_h,
                                                         offs_k, offs_v, H, K, V, BT)
            tl.store(states + (chunk * H + i_h) * K * V + tile, h.to(states.dtype.element_ty), mask=mask_h)
            h = h * decay[:, None] + _mm(tl.trans(k_to_end), b_v, DOT_T, EMULATE)
            if PREFETCH:
                k_to_end, decay, b_v = n_k_to_end, n_decay, n_v
            chunk += 1
        if STORE_FINAL:
            tl.store(final + i_nh.to(tl.int64) * K * V + tile, h, mask=mask_h)

    @triton.jit
    def _pair_tiles(q, k, b, rows_i, ok_i, rows_j, ok_j, cols, scale, sq_t, sq_h, sk_t, sk_h, i_h,
                    H: tl.constexpr, K: tl.constexpr):
        """The key columns ``cols`` of a sub-chunk pair: scaled q and decays b of rows i, k and b of rows j."""
        b_q = _tile(q, rows_i, ok_i, sq_t, i_h * sq_h, cols, K) * scale
        b_bi = _tile(b, rows_i, ok_i, H * K, i_h * K, cols, K)
        b_k = _tile(k, rows_j, ok_j, sk_t, i_h * sk_h, cols, K)
        b_bj = _tile(b, rows_j, ok_j, H * K, i_h * K, cols, K)
        return b_q, b_bi, b_k, b_bj

    @triton.jit
    def _diag_cube(q, k, b, rows, ok, scale, sq_t, sq_h, sk_t, sk_h, i_h,
                   H: tl.constexpr, K: tl.constexpr, BC: tl.constexpr, BKD: tl.constexpr):
        """A diagonal sub-chunk block's causal scores, elementwise over [BC, BC, BKD] cubes: exact
        for any decay (every exponent b_t - b_s with s <= t is <= 0); a narrower K step than the
        products' keeps the cube in registers."""
        r = tl.arange(0, BC)
        causal = r[:, None] >= r[None, :]
        acc = tl.zeros((BC, BC), dtype=tl.float32)
        for k0 in range(0, K, BKD):
            cols = k0 + tl.arange(0, BKD)
            b_q, b_bi, b_k, b_bj = _pair_tiles(q, k, b, rows, ok, rows, ok, cols, scale, sq_t, sq_h, sk_t, sk_h,
                                               i_h, H, K)
            gap = tl.where(causal[:, :, None], b_bi[:, None, :] - b_bj[None, :, :], 0.0)
            acc += tl.sum(b_q[:, None, :] * b_k[None, :, :] * tl.exp(gap), 2)
        return tl.where(causal, acc, 0.0)

    @triton.jit
    def _intra_scores_kernel(q, k, b, scores, table, scale, sq_t, sq_h, sk_t, sk_h,
                             H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
                             BK: tl.constexpr, BKD: tl.constexpr, SAFE: tl.constexpr, PRECISION: tl.constexpr):
        """The causal scores of one chunk and head, a 16-row block i at a time: rows i against every
        key row up to the end of block i in one product, both sides factored around block i's first
        row n. For keys before n both exponents are <= 0; for the diagonal block's keys the key
        side's exponent b_n - b_s is >= 0, clamped at SAFE: a block where any channel decays by more
        than SAFE across it is recomputed elementwise (``_diag_cube``)."""
        i_c, i_h = tl.program_id(0), tl.program_id(1)
        start = tl.load(table + 2 * i_c)
        end = tl.load(table + 2 * i_c + 1)
        if end <= start:  # past the real chunk count (chunk_is_empty)
            return
        r = tl.arange(0, BC)
        c = tl.arange(0, BT)
        rows_c = start + c
        for i in tl.static_range(BT // BC):
            rows_i = start + i * BC + r
            ok_i = rows_i < end
            if start + i * BC < end:
                ref = (start + i * BC).to(tl.int64)
                ok_c = (rows_c < end) & (c < (i + 1) * BC)  # the keys up to the end of block i
                acc = tl.zeros((BC, BT), dtype=tl.float32)
                top = tl.full([], 0.0, tl.float32)  # the largest key-side exponent seen
                for k0 in range(0, K, BK):
                    cols = k0 + tl.arange(0, BK)
                    b_q, b_bi, b_k, b_bc = _pair_tiles(q, k, b, rows_i, ok_i, rows_c, ok_c, cols, scale,
                                                       sq_t, sq_h, sk_t, sk_h, i_h, H, K)
                    b_ref = tl.load(b + (ref * H + i_h) * K + cols, mask=cols < K, other=0.0)
                    up = tl.where(ok_c[:, None], b_ref[None, :] - b_bc, 0.0)
                    top = tl.maximum(top, tl.max(up))
                    q_side = b_q * tl.exp(tl.where(ok_i[:, None], b_bi - b_ref[None, :], 0.0))
                    k_side = b_k * tl.exp(tl.minimum(up, SAFE))
                    acc += tl.dot(q_side, tl.trans(k_side), input_precision=PRECISION)
                acc = tl.where((i * BC + r)[:, None] >= c[None, :], acc, 0.0)
                safe = top <= SAFE
                # the diagonal block's columns are left to the elementwise sum where it is not safe
                keep = (c < i * BC) | (c >= (i + 1) * BC) | (tl.zeros([BT], tl.float32) + top <= SAFE)
                out = scores + (rows_i.to(tl.int64)[:, None] * H + i_h) * BT + c[None, :]
                tl.store(out, acc, mask=ok_i[:, None] & keep[None, :])
                if not safe:
                    cube = _diag_cube(q, k, b, rows_i, ok_i, scale, sq_t, sq_h, sk_t, sk_h, i_h, H, K, BC, BKD)
                    block = scores + (rows_i.to(tl.int64)[:, None] * H + i_h) * BT + (i * BC + r)[None, :]
                    tl.store(block, cube, mask=ok_i[:, None])

    @triton.jit
    def _chunk_output_kernel(q, v, b, states, scores, o, table, scale, sq_t, sq_h, sv_t, sv_h,
                             H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                             BK: tl.constexpr, BV: tl.constexpr, DOT_T: tl.constexpr, EMULATE: tl.constexpr):
        i_v, i_c, i_h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        if chunk_is_empty(table, i_c):
            return
        rows, row_ok = chunk_rows(table, i_c, BT)
        r = tl.arange(0, BT)
        offs_v = i_v * BV + tl.arange(0, BV)
        mask_v = offs_v < V
        acc = tl.zeros((BT, BV), dtype=tl.float32)
        state = states + (i_c.to(tl.int64) * H + i_h) * K * V
        for k0 in range(0, K, BK):
            cols = k0 + tl.arange(0, BK)
            b_q = _tile(q, rows, row_ok, sq_t, i_h * sq_h, cols, K) * scale
            b_b = _tile(b, rows, row_ok, H * K, i_h * K, cols, K)
            b_h = tl.load(state + cols[:, None] * V + offs_v[None, :],
                          mask=(cols < K)[:, None] & mask_v[None, :], other=0.0)
            acc += _mm(b_q * tl.exp(b_b), b_h, DOT_T, EMULATE)
        b_a = tl.load(scores + (rows.to(tl.int64)[:, None] * H + i_h) * BT + r[None, :],
                      mask=row_ok[:, None] & (r[:, None] >= r[None, :]), other=0.0)
        b_v = _tile(v, rows, row_ok, sv_t, i_h * sv_h, offs_v, V)
        acc += _mm(b_a, b_v, DOT_T, EMULATE)
        tl.store(o + (rows.to(tl.int64)[:, None] * H + i_h) * V + offs_v[None, :], acc.to(o.dtype.element_ty),
                 mask=row_ok[:, None] & mask_v[None, :])
