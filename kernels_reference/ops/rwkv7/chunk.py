"""Chunked Triton kernels of RWKV-7's time mix (a diagonal-plus-low-rank delta rule): long prefills.

Per head, a sequence is cut into chunks of L = 16 tokens. With S0 the state a chunk starts from and
c_t = w_1 + ... + w_t the per-key-channel cumulative log decay inside it (c_0 = 0), unrolling
S_t = diag(e^{w_t}) S_{t-1} + b_t u_t^T + k_t v_t^T, where u_t = S_{t-1}^T a_t is what the
rank-one correction moves, gives

    u_t = S0^T (a_t e^{c_{t-1}}) + sum_{s<t} T[t,s] u_s + sum_{s<t} P[t,s] v_s
          T[t,s] = sum_k a_tk b_sk e^{c_{t-1,k} - c_sk},  P[t,s]: the same with k_s for b_s
    so U = W S0 + Y V  with  W = (I - T)^{-1} (A e^{c_{t-1}}),  Y = (I - T)^{-1} P
    o_t = (r_t e^{c_t})^T S0 scale + sum_{s<=t} (Qb[t,s] u_s + Qk[t,s] v_s)
          Qb[t,s] = sum_k r_tk b_sk e^{c_tk - c_sk} scale,  Qk[t,s]: the same with k_s
    S_L = diag(e^{c_L}) S0 + (B e^{c_L - c})^T U + (K e^{c_L - c})^T V

The pairwise sums T, P, Qb, Qk are products of the rows split at the chunk's start,
e^{c_t - c_s} = e^{c_t} e^{-c_s}: the second factor grows with the chunk's decay, which for RWKV-7
(at most e^{-0.5} nats a token) stays under 10 nats over 16 tokens. A chunk whose decay reaches
SAFE_NATS in some channel has them summed elementwise over [L, L, key block] cubes instead, where
every exponent is a difference c_t - c_s <= 0 and nothing can overflow. (Before 2026-12-05 every
chunk took the cubes: 6.8 ms of the 10.6 ms prefill of the 32k-token case on an H100.) Three kernels:

* ``_chunk_prep_kernel``, one program per (chunk, head): T, P, Qb, Qk; (I - T)^{-1} as
  (I + T)(I + T^2)(I + T^4)(I + T^8) (T is strictly lower triangular, so T^16 = 0; or by forward
  substitution, INVERSE_BY_POWERS); W, Y and the decayed rows r e^c, b e^{c_L - c}, k e^{c_L - c}
  and e^{c_L} that the other two kernels read.
* ``_chunk_walk_kernel``, one program per (sequence, head, V block): walks the sequence's chunks in
  order with the state slice in float32 registers: U = W S + Y V, the state each chunk starts from
  stored, then S <- e^{c_L} S + (B e^{c_L - c})^T U + (K e^{c_L - c})^T V.
* ``_chunk_output_kernel``, one program per (chunk, head, V block): o = (r e^c) S0 + Qb U + Qk V.

Products take their operands in the input dtype (bf16 on the tensor cores) with float32
accumulation, as FLA's chunked DPLR kernels do, except the pairwise sums' (float32 operands, TF32 on
the GPU: PREP_PRECISION); decays, T's inverse and the carried state stay float32.
"""
from typing import Optional, Tuple

import torch

from ...triton_rows import whole_tiles
from ..gated_delta.layout import (TokenHeads, chunk_is_empty, chunk_rows, chunked_scan_start, mm as _mm,
                                  store_rows, tile as _tile, walk_start)

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

CHUNK = 16
# Whether prefill (any step that is not one token per sequence) takes these kernels rather than the
# recurrent one. On, for the task's bar: a case's bar is the reference's own error, and with the
# recurrent kernel's float32 state it rejected honest chunked kernels, the form production runs
# (this file's kernels as a candidate: 2.6-2.9x the bar on every bf16 prefill case of the CPU
# profile; FLA's chunk_rwkv7 2.11x on an H100, 2026-12-05). ``python3 -m benchmarks scan_tiles rwkv7``
# times both forms side by side (on an H100 on 2026-12-05: 10.6 against 17.4-25.4 ms on 32k tokens,
# before the prep kernel's products).
PREFILL_CHUNKED = True
# V columns of the state slice per walking program (more programs for one long sequence) and the
# key block of the prep kernel's [L, L, key block] cubes; module-level so that
# ``python3 -m benchmarks scan_tiles rwkv7`` can sweep them
WALK_BLOCK_V = 16
CUBE_BLOCK_K = 16
# Whether the walk loads each next chunk's tiles a step ahead, by hand (what took Mamba-2's serial
# state pass from 1131 to 174 us on an H100). On an H100 on 2026-12-06 (``scan_tiles rwkv7``) it took
# the walk of the 32k-token case from 2970 to 1791 us (the prefill 6082 -> 4900 us), errors unchanged.
WALK_PREFETCH = True
# The prep kernel's pairwise sums as products: e^{c_t - c_s} = e^{c_t} e^{-c_s}, the second factor
# growing with the chunk's decay. RWKV-7's log decay per token is at most e^{-0.5} ~ 0.61 nats, so a
# 16-token chunk stays under ~10 nats; a chunk that decays by more than SAFE_NATS in any channel
# (decays far beyond the layer's) is summed elementwise over cubes instead, exact for any decay.
SAFE_NATS = 40.0
PREP_BLOCK_K = 64  # key block of those products
# Their float32 operands' precision on the GPU: "ieee" (full float32 on CUDA cores), "tf32x3" or
# "tf32" (tensor cores). On an H100 (2026-12-05) tf32 took the prep kernel from 5.2 to 3.1 ms on the
# 32k-token case and moved the check's relative error against the float64 recurrence from 0.00330 to
# 0.00332; T's inverse and the products with it stay full float32.
PREP_PRECISION = "tf32"
# (I - T)^{-1} as a product of powers of T (a few 16 x 16 products) rather than by forward
# substitution (15 dependent steps, each two reductions across the program's threads)
INVERSE_BY_POWERS = True


def chunk_forward(r: TokenHeads, w: TokenHeads, k: TokenHeads, v: TokenHeads, a: TokenHeads, b: TokenHeads,
                  scale: float, initial_state: Optional[torch.Tensor], cu_seqlens: torch.Tensor,
                  output_final_state: bool) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    t, heads, vd = v.tensor.shape
    kd = k.tensor.shape[-1]
    n = cu_seqlens.numel() - 1
    device, dtype = v.tensor.device, v.tensor.dtype
    o, final, layout, dot = chunked_scan_start(v, kd, cu_seqlens, initial_state, output_final_state, CHUNK)
    if layout is None:
        return o, final
    chunks = layout.table.shape[0]
    whole = whole_tiles()
    bk = triton.next_power_of_2(kd)
    f32 = torch.float32
    per_token = lambda width, dt: torch.empty((t, heads, width), dtype=dt, device=device)
    wmat, rd, bd, kd_rows = (per_token(kd, dtype) for _ in range(4))
    ymat, qb, qk = (per_token(CHUNK, f32) for _ in range(3))
    decay = torch.empty((chunks, heads, kd), dtype=f32, device=device)
    _chunk_prep_kernel[(chunks, heads)](
        r.tensor, w.tensor, k.tensor, a.tensor, b.tensor, wmat, rd, bd, kd_rows, ymat, qb, qk, decay,
        layout.table, scale, r.token_stride, r.head_stride, w.token_stride, w.head_stride,
        k.token_stride, k.head_stride, a.token_stride, a.head_stride, b.token_stride, b.head_stride,
        H=heads, K=kd, L=CHUNK, BK=bk, BKP=bk if whole else min(PREP_BLOCK_K, bk),
        BKC=bk if whole else min(CUBE_BLOCK_K, bk), SAFE=SAFE_NATS,
        PRECISION="ieee" if dot["EMULATE"] else PREP_PRECISION, INVERSE_BY_POWERS=INVERSE_BY_POWERS,
        SQUARINGS=CHUNK.bit_length() - 2, **dot, num_warps=4)

    bv = triton.next_power_of_2(vd) if whole else min(WALK_BLOCK_V, triton.next_power_of_2(vd))
    states = torch.empty((chunks, heads, kd, vd), dtype=dtype, device=device)
    u = per_token(vd, f32)
    h0 = initial_state
    _chunk_walk_kernel[(triton.cdiv(vd, bv), n * heads)](
        v.tensor, wmat, ymat, bd, kd_rows, decay, states, u, h0 if h0 is not None else decay,
        final if final is not None else decay, cu_seqlens, layout.first_chunk, v.token_stride, v.head_stride,
        H=heads, K=kd, V=vd, L=CHUNK, BK=bk, BV=bv, HAS_H0=h0 is not None, STORE_FINAL=final is not None,
        PREFETCH=WALK_PREFETCH, **dot, num_warps=4)

    bvo = triton.next_power_of_2(vd) if whole else min(64, triton.next_power_of_2(vd))
    _chunk_output_kernel[(triton.cdiv(vd, bvo), chunks, heads)](
        v.tensor, rd, qb, qk, u, states, o, layout.table, v.token_stride, v.head_stride,
        H=heads, K=kd, V=vd, L=CHUNK, BK=bk, BV=bvo, **dot, num_warps=4)
    return o, final


if triton is not None:

    @triton.jit
    def _zero_pairs(L: tl.constexpr):
        """Four [L, L] float32 accumulators of pairwise sums (T with b, T with k, Qb, Qk)."""
        z = tl.zeros((L, L), dtype=tl.float32)
        return z, z, z, z

    @triton.jit
    def _token_tiles(r, w, k, a, b, rows, ok, cols, scale, sr_t, sr_h, sw_t, sw_h, sk_t, sk_h, sa_t, sa_h, sb_t, sb_h,
                     i_h, K: tl.constexpr):
        """The chunk's rows of w, a, b, k and scaled r over the key columns ``cols``, float32 (rows
        past the chunk load 0: no decay, no terms)."""
        b_w = _tile(w, rows, ok, sw_t, i_h * sw_h, cols, K)
        b_a = _tile(a, rows, ok, sa_t, i_h * sa_h, cols, K)
        b_b = _tile(b, rows, ok, sb_t, i_h * sb_h, cols, K)
        b_k = _tile(k, rows, ok, sk_t, i_h * sk_h, cols, K)
        b_r = _tile(r, rows, ok, sr_t, i_h * sr_h, cols, K) * scale
        return b_w, b_a, b_b, b_k, b_r

    @triton.jit
    def _pair_cubes(r, w, k, a, b, rows, ok, scale, sr_t, sr_h, sw_t, sw_h, sk_t, sk_h, sa_t, sa_h, sb_t, sb_h, i_h,
                    K: tl.constexpr, L: tl.constexpr, BKC: tl.constexpr):
        """T (a with b, a with k) and Qb, Qk summed elementwise over [L, L, BKC] cubes, every exponent
        c_t - c_s <= 0 (masked before exp): exact for any decay, and eight times the exponentials of
        the factored products."""
        i = tl.arange(0, L)
        before = i[:, None] > i[None, :]  # s < t
        upto = i[:, None] >= i[None, :]  # s <= t
        t_ab, t_ak, q_rb, q_rk = _zero_pairs(L)
        for k0 in range(0, K, BKC):
            cols = k0 + tl.arange(0, BKC)
            b_w, b_a, b_b, b_k, b_r = _token_tiles(r, w, k, a, b, rows, ok, cols, scale, sr_t, sr_h, sw_t, sw_h,
                                                   sk_t, sk_h, sa_t, sa_h, sb_t, sb_h, i_h, K)
            c = tl.cumsum(b_w, 0)
            c_prev = c - b_w
            e_before = tl.exp(tl.where(before[:, :, None], c_prev[:, None, :] - c[None, :, :], float("-inf")))
            t_ab += tl.sum(b_a[:, None, :] * b_b[None, :, :] * e_before, 2)
            t_ak += tl.sum(b_a[:, None, :] * b_k[None, :, :] * e_before, 2)
            e_upto = tl.exp(tl.where(upto[:, :, None], c[:, None, :] - c[None, :, :], float("-inf")))
            q_rb += tl.sum(b_r[:, None, :] * b_b[None, :, :] * e_upto, 2)
            q_rk += tl.sum(b_r[:, None, :] * b_k[None, :, :] * e_upto, 2)
        return t_ab, t_ak, q_rb, q_rk

    @triton.jit
    def _chunk_prep_kernel(r, w, k, a, b, wmat, rd, bd, kd_rows, ymat, qb, qk, decay, table, scale,
                           sr_t, sr_h, sw_t, sw_h, sk_t, sk_h, sa_t, sa_h, sb_t, sb_h,
                           H: tl.constexpr, K: tl.constexpr, L: tl.constexpr, BK: tl.constexpr,
                           BKP: tl.constexpr, BKC: tl.constexpr, SAFE: tl.constexpr, PRECISION: tl.constexpr,
                           INVERSE_BY_POWERS: tl.constexpr, SQUARINGS: tl.constexpr,
                           DOT_T: tl.constexpr, EMULATE: tl.constexpr):
        i_c, i_h = tl.program_id(0), tl.program_id(1)
        if chunk_is_empty(table, i_c):
            return
        rows, ok = chunk_rows(table, i_c, L)
        i = tl.arange(0, L)
        before = i[:, None] > i[None, :]  # s < t
        upto = i[:, None] >= i[None, :]  # s <= t
        t_ab, t_ak, q_rb, q_rk = _zero_pairs(L)
        top = tl.full([], 0.0, tl.float32)  # the largest |c| seen: how far the factors below reach
        for k0 in range(0, K, BKP):
            cols = k0 + tl.arange(0, BKP)
            b_w, b_a, b_b, b_k, b_r = _token_tiles(r, w, k, a, b, rows, ok, cols, scale, sr_t, sr_h, sw_t, sw_h,
                                                   sk_t, sk_h, sa_t, sa_h, sb_t, sb_h, i_h, K)
            c = tl.cumsum(b_w, 0)
            total = tl.sum(b_w, 0)
            top = tl.maximum(top, tl.max(tl.abs(c)))
            # e^{c_t - c_s} split at the chunk's start: e^{c_t} e^{-c_s}, the second factor clamped
            # (a chunk that reaches the clamp is summed elementwise below instead)
            grow = tl.exp(tl.minimum(-c, SAFE))
            r_side = b_r * tl.exp(c)
            a_side = b_a * tl.exp(c - b_w)
            t_ab += tl.dot(a_side, tl.trans(b_b * grow), input_precision=PRECISION)
            t_ak += tl.dot(a_side, tl.trans(b_k * grow), input_precision=PRECISION)
            q_rb += tl.dot(r_side, tl.trans(b_b * grow), input_precision=PRECISION)
            q_rk += tl.dot(r_side, tl.trans(b_k * grow), input_precision=PRECISION)
            to_end = tl.exp(total[None, :] - c)
            store_rows(rd, rows, ok, H, i_h, cols, K, r_side)
            store_rows(bd, rows, ok, H, i_h, cols, K, b_b * to_end)
            store_rows(kd_rows, rows, ok, H, i_h, cols, K, b_k * to_end)
            tl.store(decay + (i_c.to(tl.int64) * H + i_h) * K + cols, tl.exp(total), mask=cols < K)
        t_ab = tl.where(before, t_ab, 0.0)
        t_ak = tl.where(before, t_ak, 0.0)
        q_rb = tl.where(upto, q_rb, 0.0)
        q_rk = tl.where(upto, q_rk, 0.0)
        if top > SAFE:
            t_ab, t_ak, q_rb, q_rk = _pair_cubes(r, w, k, a, b, rows, ok, scale, sr_t, sr_h, sw_t, sw_h, sk_t, sk_h,
                                                 sa_t, sa_h, sb_t, sb_h, i_h, K, L, BKC)
        eye = (i[:, None] == i[None, :]).to(tl.float32)
        if INVERSE_BY_POWERS:
            # T is strictly lower triangular, so T^L = 0 and (I - T)^{-1} = I + T + ... + T^{L-1}
            # = (I + T)(I + T^2)(I + T^4)...: log2(L) - 1 squarings, each folded in by one product
            power = t_ab
            inv = eye + t_ab
            for _ in tl.static_range(SQUARINGS):
                power = tl.dot(power, power, input_precision="ieee")
                inv += tl.dot(inv, power, input_precision="ieee")
        else:
            # by forward substitution: row t = e_t + sum_{s<t} T[t,s] row s
            inv = eye
            for t in tl.static_range(1, L):
                t_row = tl.sum(tl.where(i[:, None] == t, t_ab, 0.0), 0)
                new = tl.where(i == t, 1.0, 0.0) + tl.sum(t_row[:, None] * inv, 0)
                inv = tl.where(i[:, None] == t, new[None, :], inv)
        store_rows(ymat, rows, ok, H, i_h, i, L, tl.dot(inv, t_ak, input_precision="ieee"))
        store_rows(qb, rows, ok, H, i_h, i, L, q_rb)
        store_rows(qk, rows, ok, H, i_h, i, L, q_rk)
        # W = (I - T)^{-1} (A e^{c_{t-1}}), key block by key block
        for k0 in range(0, K, BKC):
            cols = k0 + tl.arange(0, BKC)
            b_w = _tile(w, rows, ok, sw_t, i_h * sw_h, cols, K)
            b_a = _tile(a, rows, ok, sa_t, i_h * sa_h, cols, K)
            c_prev = tl.cumsum(b_w, 0) - b_w
            store_rows(wmat, rows, ok, H, i_h, cols, K, tl.dot(inv, b_a * tl.exp(c_prev), input_precision="ieee"))

    @triton.jit
    def _walk_tiles(v, wmat, ymat, bd, kd_rows, decay, rows, ok, chunk, k_limit, sv_t, sv_h, i_h, offs_k, offs_v,
                    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr):
        """What the walk reads of one chunk (rows past the sequence and a chunk past its last read 0):
        W, Y, the V slice of v, the decayed b and k rows, and the chunk's decay e^{c_L} (its keys below
        ``k_limit``: K, or 0 for no chunk)."""
        i = tl.arange(0, L)
        b_w = _tile(wmat, rows, ok, H * K, i_h * K, offs_k, K)
        b_y = _tile(ymat, rows, ok, H * L, i_h * L, i, L)
        b_v = _tile(v, rows, ok, sv_t, i_h * sv_h, offs_v, V)
        b_bd = _tile(bd, rows, ok, H * K, i_h * K, offs_k, K)
        b_kd = _tile(kd_rows, rows, ok, H * K, i_h * K, offs_k, K)
        g = tl.load(decay + (chunk * H + i_h) * K + offs_k, mask=offs_k < k_limit, other=0.0)
        return b_w, b_y, b_v, b_bd, b_kd, g

    @triton.jit
    def _chunk_walk_kernel(v, wmat, ymat, bd, kd_rows, decay, states, u, h0, final, cu_seqlens, first_chunk,
                           sv_t, sv_h, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr,
                           BK: tl.constexpr, BV: tl.constexpr, HAS_H0: tl.constexpr, STORE_FINAL: tl.constexpr,
                           PREFETCH: tl.constexpr, DOT_T: tl.constexpr, EMULATE: tl.constexpr):
        i_v, i_nh = tl.program_id(0), tl.program_id(1)
        i_n, i_h = i_nh // H, i_nh % H
        offs_k = tl.arange(0, BK)
        offs_v = i_v * BV + tl.arange(0, BV)
        mask_k, mask_v = offs_k < K, offs_v < V
        mask_h = mask_k[:, None] & mask_v[None, :]
        tile = offs_k[:, None] * V + offs_v[None, :]
        bos, eos, chunk, h = walk_start(h0, cu_seqlens, first_chunk, i_n, i_nh, tile, mask_h, K, V, BK, BV, HAS_H0)
        i = tl.arange(0, L)
        if PREFETCH:  # the first chunk's tiles before the loop, then each next chunk's a step ahead
            b_w, b_y, b_v, b_bd, b_kd, g = _walk_tiles(v, wmat, ymat, bd, kd_rows, decay, bos + i, bos + i < eos,
                                                       chunk, tl.where(bos < eos, K, 0), sv_t, sv_h, i_h, offs_k,
                                                       offs_v, H, K, V, L)
        for start in range(bos, eos, L):
            rows = start + i
            ok = rows < eos
            if PREFETCH:
                # in flight while this chunk's dependent products run (the walk is latency-bound)
                n_w, n_y, n_v, n_bd, n_kd, n_g = _walk_tiles(v, wmat, ymat, bd, kd_rows, decay, rows + L,
                                                             rows + L < eos, chunk + 1,
                                                             tl.where(start + L < eos, K, 0),
                                                             sv_t, sv_h, i_h, offs_k, offs_v, H, K, V, L)
            else:
                b_w, b_y, b_v, b_bd, b_kd, g = _walk_tiles(v, wmat, ymat, bd, kd_rows, decay, rows, ok, chunk,
                                                           K, sv_t, sv_h, i_h, offs_k, offs_v, H, K, V, L)
            tl.store(states + (chunk * H + i_h) * K * V + tile, h.to(states.dtype.element_ty), mask=mask_h)
            b_u = _mm(b_w, h, DOT_T, EMULATE) + _mm(b_y, b_v, DOT_T, EMULATE)
            store_rows(u, rows, ok, H, i_h, offs_v, V, b_u)
            h = h * g[:, None] + _mm(tl.trans(b_bd), b_u, DOT_T, EMULATE) + _mm(tl.trans(b_kd), b_v, DOT_T, EMULATE)
            if PREFETCH:
                b_w, b_y, b_v, b_bd, b_kd, g = n_w, n_y, n_v, n_bd, n_kd, n_g
            chunk += 1
        if STORE_FINAL:
            tl.store(final + i_nh.to(tl.int64) * K * V + tile, h, mask=mask_h)

    @triton.jit
    def _chunk_output_kernel(v, rd, qb, qk, u, states, o, table, sv_t, sv_h,
                             H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, L: tl.constexpr,
                             BK: tl.constexpr, BV: tl.constexpr, DOT_T: tl.constexpr, EMULATE: tl.constexpr):
        i_v, i_c, i_h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        if chunk_is_empty(table, i_c):
            return
        rows, ok = chunk_rows(table, i_c, L)
        i = tl.arange(0, L)
        offs_k = tl.arange(0, BK)
        offs_v = i_v * BV + tl.arange(0, BV)
        mask_v = offs_v < V
        s0 = tl.load(states + (i_c.to(tl.int64) * H + i_h) * K * V + offs_k[:, None] * V + offs_v[None, :],
                     mask=(offs_k < K)[:, None] & mask_v[None, :], other=0.0)
        acc = _mm(_tile(rd, rows, ok, H * K, i_h * K, offs_k, K), s0, DOT_T, EMULATE)
        acc += _mm(_tile(qb, rows, ok, H * L, i_h * L, i, L), _tile(u, rows, ok, H * V, i_h * V, offs_v, V),
                   DOT_T, EMULATE)
        acc += _mm(_tile(qk, rows, ok, H * L, i_h * L, i, L), _tile(v, rows, ok, sv_t, i_h * sv_h, offs_v, V),
                   DOT_T, EMULATE)
        store_rows(o, rows, ok, H, i_h, offs_v, V, acc)
