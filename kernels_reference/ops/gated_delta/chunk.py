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

Two kernels:
* ``_chunk_wy_kernel``, one program per (chunk, value head), all chunks in parallel: builds A,
  inverts I + A by forward substitution in float32 and writes W and U.
* ``_chunk_state_output_kernel``, one program per (sequence, value head, V block): walks the
  sequence's chunks in order with the state in float32 registers, writes each chunk's output and
  the final state. The output is computed right there (the state never leaves the registers).

Matrix products take their operands in the input dtype (bf16: tensor cores) with float32
accumulation, as production kernels do; the state, the decays, the triangular solve and the
normalisation stay float32.
"""
from typing import Optional, Tuple

import torch

from .layout import TokenHeads, interpreting

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

CHUNK = 64


def chunk_table(cu_seqlens: torch.Tensor, chunk: int = CHUNK) -> torch.Tensor:
    """int32 [chunks, 2]: (first token, end token) of every chunk of every sequence, in order.

    Needs the lengths on the host (one sync) to size the grid; prefill is not graph-captured."""
    cu = cu_seqlens.to("cpu", torch.int64)
    lengths = cu[1:] - cu[:-1]
    per_seq = (lengths + chunk - 1) // chunk
    seq = torch.repeat_interleave(torch.arange(len(lengths)), per_seq)
    first_chunk = torch.cumsum(per_seq, 0) - per_seq
    index_in_seq = torch.arange(int(per_seq.sum())) - first_chunk[seq]
    start = cu[seq] + index_in_seq * chunk
    end = torch.minimum(start + chunk, cu[seq + 1])
    return torch.stack([start, end], 1).to(torch.int32).to(cu_seqlens.device)


def chunk_forward(q: TokenHeads, k: TokenHeads, v: TokenHeads, g: TokenHeads, beta: TokenHeads, scale: float,
                  initial_state: Optional[torch.Tensor], cu_seqlens: torch.Tensor, output_final_state: bool,
                  use_qk_l2norm: bool) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    t, hv, vd = v.tensor.shape
    hk, kd = k.tensor.shape[1], k.tensor.shape[-1]
    n = cu_seqlens.numel() - 1
    device, dtype = v.tensor.device, v.tensor.dtype
    o = torch.empty((t, hv, vd), dtype=dtype, device=device)
    final = torch.empty((n, hv, kd, vd), dtype=torch.float32, device=device) if output_final_state else None
    if n == 0 or t == 0:
        if final is not None:
            final.copy_(initial_state if initial_state is not None else torch.zeros_like(final))
        return o, final
    table = chunk_table(cu_seqlens)
    block_k = triton.next_power_of_2(kd)
    block_v_all = triton.next_power_of_2(vd)
    w = torch.empty((t, hv, kd), dtype=dtype, device=device)
    u = torch.empty((t, hv, vd), dtype=dtype, device=device)
    group = hv // hk
    dot = dict(DOT_T=_DOT_TYPES[dtype], EMULATE=interpreting() or not v.tensor.is_cuda)
    _chunk_wy_kernel[(table.shape[0], hv)](
        k.tensor, v.tensor, g.tensor, beta.tensor, w, u, table,
        k.token_stride, k.head_stride, v.token_stride, v.head_stride,
        g.token_stride, g.head_stride, beta.token_stride, beta.head_stride,
        HV=hv, GROUP=group, K=kd, V=vd, BT=CHUNK, BK=block_k,
        BV=block_v_all if interpreting() else min(64, block_v_all), USE_L2NORM=use_qk_l2norm, **dot, num_warps=4)
    # 64-wide V blocks on the GPU, two stages. 32-wide blocks (tried for few (sequence, head) pairs,
    # to give more programs) faulted on the H200 with Triton 3.6 (2026-12-04): compute-sanitizer
    # found shared memory read out of range inside this kernel's dots at two and three stages and
    # with 8 warps, and the timed runs of a 4096-token prefill faulted 3 times in 3. At one stage
    # that run was clean, but 2 of the task's 7 tests on the H200 still hit an illegal address
    # (the kernel not identified). 64-wide blocks at two stages ran that prefill clean under the
    # sanitizer, in 1.78 ms against the 32-wide blocks' 1.30 ms.
    block_v = block_v_all if interpreting() else min(block_v_all, 64)
    h0 = initial_state
    _chunk_state_output_kernel[(triton.cdiv(vd, block_v), n * hv)](
        q.tensor, k.tensor, w, u, g.tensor, o, h0 if h0 is not None else o,
        final if final is not None else o, cu_seqlens, scale,
        q.token_stride, q.head_stride, k.token_stride, k.head_stride, g.token_stride, g.head_stride,
        HV=hv, GROUP=group, K=kd, V=vd, BT=CHUNK, BK=block_k, BV=block_v, USE_L2NORM=use_qk_l2norm,
        HAS_H0=h0 is not None, STORE_HT=final is not None, **dot, num_warps=4, num_stages=2)
    return o, final


if triton is not None:
    _DOT_TYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}

    @triton.jit
    def _unit_lower_inverse(a, BT: tl.constexpr, rows_used):
        """(I + a)^-1 for a strictly lower triangular [BT, BT] float32 tile, row by row:
        row i of the inverse is e_i minus a[i, :j<i] times the rows above it (already final)."""
        r = tl.arange(0, BT)
        inv = (r[:, None] == r[None, :]).to(tl.float32)
        for i in range(1, rows_used):  # rows past the chunk's end stay identity rows
            a_row = tl.sum(tl.where(r[:, None] == i, a, 0.0), 0)
            correction = tl.sum(a_row[:, None] * inv, 0)
            inv = tl.where(r[:, None] == i, inv - correction[None, :], inv)
        return inv

    @triton.jit
    def _mm(a, b, DOT_T: tl.constexpr, EMULATE: tl.constexpr):
        """a @ b with both operands rounded to DOT_T and float32 accumulation. Half operands go to
        the tensor cores; float32 ones keep full precision (no TF32). The interpreter multiplies
        half tiles wrongly (it reads their raw bits), so there the rounded operands are upcast."""
        if EMULATE or DOT_T == tl.float32:
            return tl.dot(a.to(DOT_T).to(tl.float32), b.to(DOT_T).to(tl.float32), input_precision="ieee")
        else:
            return tl.dot(a.to(DOT_T), b.to(DOT_T))

    @triton.jit
    def _load_heads(ptr, rows, row_mask, token_stride, head, head_stride, offs, width):
        """[rows, width] of one head (float32); rows past the chunk and columns past width read 0."""
        p = ptr + rows.to(tl.int64)[:, None] * token_stride + head * head_stride + offs[None, :]
        return tl.load(p, mask=row_mask[:, None] & (offs < width)[None, :], other=0.0).to(tl.float32)

    @triton.jit
    def _l2_rows(x):
        return x * tl.rsqrt(tl.sum(x * x, 1) + 1e-6)[:, None]

    @triton.jit
    def _chunk_wy_kernel(k, v, g, beta, w, u, table,
                         sk_t, sk_h, sv_t, sv_h, sg_t, sg_h, sb_t, sb_h,
                         HV: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                         BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, USE_L2NORM: tl.constexpr,
                         DOT_T: tl.constexpr, EMULATE: tl.constexpr):
        i_c, i_hv = tl.program_id(0), tl.program_id(1)
        i_hk = i_hv // GROUP
        start = tl.load(table + 2 * i_c)
        end = tl.load(table + 2 * i_c + 1)
        rows = start + tl.arange(0, BT)
        row_ok = rows < end
        offs_k = tl.arange(0, BK)
        b_k = _load_heads(k, rows, row_ok, sk_t, i_hk, sk_h, offs_k, K)
        if USE_L2NORM:
            b_k = _l2_rows(b_k)
        b_g = tl.load(g + rows.to(tl.int64) * sg_t + i_hv * sg_h, mask=row_ok, other=0.0).to(tl.float32)
        b_beta = tl.load(beta + rows.to(tl.int64) * sb_t + i_hv * sb_h, mask=row_ok, other=0.0).to(tl.float32)
        b_cum = tl.cumsum(b_g, 0)
        r = tl.arange(0, BT)
        below = r[:, None] > r[None, :]
        kk = _mm(b_k, tl.trans(b_k), DOT_T, EMULATE)
        decay = tl.exp(tl.where(below, b_cum[:, None] - b_cum[None, :], 0.0))
        a = tl.where(below, kk * decay * b_beta[:, None], 0.0)
        inv = _unit_lower_inverse(a, BT, end - start)

        out_rows = rows.to(tl.int64)[:, None] * HV + i_hv
        b_w = _mm(inv, b_k * (b_beta * tl.exp(b_cum))[:, None], DOT_T, EMULATE)
        tl.store(w + out_rows * K + offs_k[None, :], b_w.to(w.dtype.element_ty),
                 mask=row_ok[:, None] & (offs_k < K)[None, :])
        for i_v in range(0, tl.cdiv(V, BV)):
            offs_v = i_v * BV + tl.arange(0, BV)
            b_v = _load_heads(v, rows, row_ok, sv_t, i_hv, sv_h, offs_v, V)
            b_u = _mm(inv, b_v * b_beta[:, None], DOT_T, EMULATE)
            tl.store(u + out_rows * V + offs_v[None, :], b_u.to(u.dtype.element_ty),
                     mask=row_ok[:, None] & (offs_v < V)[None, :])

    @triton.jit
    def _chunk_state_output_kernel(q, k, w, u, g, o, h0, ht, cu_seqlens, scale,
                                   sq_t, sq_h, sk_t, sk_h, sg_t, sg_h,
                                   HV: tl.constexpr, GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                                   BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                                   USE_L2NORM: tl.constexpr, HAS_H0: tl.constexpr, STORE_HT: tl.constexpr,
                                   DOT_T: tl.constexpr, EMULATE: tl.constexpr):
        i_v, i_nh = tl.program_id(0), tl.program_id(1)
        i_n, i_hv = i_nh // HV, i_nh % HV
        i_hk = i_hv // GROUP
        bos = tl.load(cu_seqlens + i_n)
        eos = tl.load(cu_seqlens + i_n + 1)
        offs_k = tl.arange(0, BK)
        offs_v = i_v * BV + tl.arange(0, BV)
        mask_k, mask_v = offs_k < K, offs_v < V
        state_offs = i_nh.to(tl.int64) * K * V + offs_k[:, None] * V + offs_v[None, :]
        h = tl.zeros((BK, BV), dtype=tl.float32)
        if HAS_H0:
            h = tl.load(h0 + state_offs, mask=mask_k[:, None] & mask_v[None, :], other=0.0).to(tl.float32)
        r = tl.arange(0, BT)
        causal = r[:, None] >= r[None, :]
        for start in range(bos, eos, BT):
            rows = start + r
            row_ok = rows < eos
            b_q = _load_heads(q, rows, row_ok, sq_t, i_hk, sq_h, offs_k, K)
            b_k = _load_heads(k, rows, row_ok, sk_t, i_hk, sk_h, offs_k, K)
            if USE_L2NORM:
                b_q = _l2_rows(b_q)
                b_k = _l2_rows(b_k)
            b_q = b_q * scale
            b_g = tl.load(g + rows.to(tl.int64) * sg_t + i_hv * sg_h, mask=row_ok, other=0.0).to(tl.float32)
            b_cum = tl.cumsum(b_g, 0)
            b_last = tl.sum(b_g, 0)
            out_rows = rows.to(tl.int64)[:, None] * HV + i_hv
            b_w = tl.load(w + out_rows * K + offs_k[None, :], mask=row_ok[:, None] & mask_k[None, :],
                          other=0.0).to(tl.float32)
            b_u = tl.load(u + out_rows * V + offs_v[None, :], mask=row_ok[:, None] & mask_v[None, :],
                          other=0.0).to(tl.float32)
            v_new = b_u - _mm(b_w, h, DOT_T, EMULATE)  # the chunk's corrections V' = U - W S0
            scores = _mm(b_q, tl.trans(b_k), DOT_T, EMULATE)
            scores = tl.where(causal, scores * tl.exp(tl.where(causal, b_cum[:, None] - b_cum[None, :], 0.0)), 0.0)
            b_o = _mm(b_q * tl.exp(b_cum)[:, None], h, DOT_T, EMULATE) + _mm(scores, v_new, DOT_T, EMULATE)
            tl.store(o + out_rows * V + offs_v[None, :], b_o.to(o.dtype.element_ty),
                     mask=row_ok[:, None] & mask_v[None, :])
            k_decayed = b_k * tl.exp(b_last - b_cum)[:, None]
            h = h * tl.exp(b_last) + _mm(tl.trans(k_decayed), v_new, DOT_T, EMULATE)
        if STORE_HT:
            tl.store(ht + state_offs, h, mask=mask_k[:, None] & mask_v[None, :])
