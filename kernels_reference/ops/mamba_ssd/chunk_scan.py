"""The SSD chunked scan for prefill (Mamba-2's ``mamba_chunk_scan_combined``), in four Triton kernels.

Every sequence of the packed batch is cut into chunks of ``chunk_size`` tokens from its own first
token, so a chunk never holds two sequences. With cs_t the running sum of dt * A inside a chunk:

1. ``_step_kernel``: dt_t (bias, softplus, clamp) and cs_t per chunk and head, in float32, and the
   chunk's whole decay exp(cs_last).
2. ``_chunk_state_kernel``: the state a chunk leaves behind if it started from zero,
   sum_t exp(cs_last - cs_t) dt_t x_t B_t^T, one [P, N] GEMM over the chunk's tokens.
3. ``_chunk_cb_kernel``: C_t . B_s within each chunk, once per chunk and *group* (the heads of a
   group share B and C: Mamba-2 2.7B has one group for 80 heads), float32, into a table padded to
   the chunk's power of two; tiles wholly above the diagonal or past the chunk's tokens are never
   written (the output kernel reads the table whole and its causal select discards them).
4. ``_state_passing_kernel``: per sequence, walks its chunks in order in float32: the state entering
   chunk k is exp(cs_last of k-1) * (state entering k-1) + (state of k-1); the first one is the
   sequence's initial state (or zero), and what leaves the last chunk is the sequence's final state.
   The entering states are stored in the activations' dtype: the output's GEMM rounds them to it
   anyway, and half the bytes are what a long sequence's output kernel waits on.
5. ``_chunk_output_kernel``: y = exp(cs_t) C_t (entering state) + sum_{s<=t} (C_t . B_s)
   exp(cs_t - cs_s) dt_s x_s + D x_t, the within-chunk part as a masked quadratic form over the
   precomputed C . B, then the optional silu(z) gate.

The chunk table (which sequence and tokens each chunk covers) is built on the device from
``cu_seqlens`` for an upper bound of chunks (``ops/chunk_table.py``), so nothing reads device values
on the host; programs of chunks past the real count return at once. GEMM operands
are the activations' dtype (bf16 on tensor cores) with float32 accumulation, decay and dt factors
applied in float32 before the cast, and states are carried in float32: the numerics of production's
kernels (mamba-ssm / vLLM).
"""
from typing import Optional, Sequence, Tuple

import torch

from ...triton_rows import interpreting, whole_tiles
from ..chunk_table import chunk_table

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None


def ssd_chunk_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                   cu_seqlens: torch.Tensor, chunk_size: int, D: Optional[torch.Tensor] = None,
                   z: Optional[torch.Tensor] = None, dt_bias: Optional[torch.Tensor] = None,
                   initial_states: Optional[torch.Tensor] = None, dt_softplus: bool = True,
                   dt_limit: Sequence[float] = (0.0, float("inf")),
                   state_dtype: Optional[torch.dtype] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    tokens, heads, head_dim = x.shape
    groups, dstate = B.shape[1], B.shape[2]
    sequences = cu_seqlens.numel() - 1
    if heads % groups:
        raise ValueError(f"{heads} heads do not split into {groups} groups")
    state_dtype = state_dtype or (initial_states.dtype if initial_states is not None else torch.float32)
    dev = x.device
    out = torch.empty((tokens, heads, head_dim), dtype=x.dtype, device=dev)
    final = torch.empty((sequences, heads, head_dim, dstate), dtype=state_dtype, device=dev)
    if tokens == 0 or sequences == 0:
        if sequences:
            final.copy_(initial_states if initial_states is not None else torch.zeros_like(final))
        return out, final
    bound, chunk_seq, chunk_start, chunk_len, seq_first, seq_count = chunk_table(cu_seqlens, tokens, chunk_size)
    block_c = max(16, triton.next_power_of_2(chunk_size))  # tl.dot takes tiles of 16 and up
    f32 = torch.float32
    steps = torch.empty((bound, heads, block_c), dtype=f32, device=dev)
    cums = torch.empty((bound, heads, block_c), dtype=f32, device=dev)
    decays = torch.empty((bound, heads), dtype=f32, device=dev)
    states = torch.empty((bound, heads, head_dim, dstate), dtype=f32, device=dev)
    entering = torch.empty((bound, heads, head_dim, dstate), dtype=x.dtype, device=dev)
    cb = torch.empty((bound, groups, block_c, block_c), dtype=f32, device=dev)
    interp = interpreting() or not x.is_cuda
    whole = whole_tiles()  # the interpreter pays per program: whole chunks there
    # GEMM operands are rounded to the activations' dtype either way; float32 tiles multiply in
    # full float32 (no TF32), and off the GPU so do bf16 ones after an exact upcast, because
    # Triton's interpreter multiplies bfloat16 tiles wrongly (it reads their raw bits).
    f32_dot = interp or x.dtype == torch.float32
    A = A.to(f32).contiguous()
    ratio = heads // groups

    block_h = min(triton.next_power_of_2(heads), 4 if block_c >= 256 else 8)
    _step_kernel[(bound, triton.cdiv(heads, block_h))](
        dt, dt_bias if dt_bias is not None else dt, A, steps, cums, decays, chunk_start, chunk_len,
        heads, dt.stride(0), dt.stride(1), dt_bias.stride(0) if dt_bias is not None else 0,
        float(dt_limit[0]), float(dt_limit[1]),
        HAS_BIAS=dt_bias is not None, SOFTPLUS=dt_softplus, BLOCK_H=block_h, BLOCK_C=block_c, num_warps=4)

    block_p = min(_tile(head_dim), 64)
    block_n = min(_tile(dstate), 128)
    block_k = block_c if whole else min(block_c, 64)
    grid = (triton.cdiv(head_dim, block_p) * triton.cdiv(dstate, block_n), *_chunks_by_heads(bound, heads))
    _chunk_state_kernel[grid](
        x, B, steps, cums, states, chunk_start, chunk_len, head_dim, dstate, ratio,
        x.stride(0), x.stride(1), x.stride(2), B.stride(0), B.stride(1), B.stride(2),
        BLOCK_P=block_p, BLOCK_N=block_n, BLOCK_K=block_k, BLOCK_C=block_c, F32_DOT=f32_dot,
        HEADS_FIRST=HEADS_FIRST, num_warps=4)

    block_cb = block_c if whole else min(block_c, 64)
    tiles_cb = triton.cdiv(block_c, block_cb)
    _chunk_cb_kernel[(tiles_cb * tiles_cb, bound, groups)](
        B, C, cb, chunk_start, chunk_len, dstate, B.stride(0), B.stride(1), B.stride(2),
        C.stride(0), C.stride(1), C.stride(2), x,
        BLOCK=block_cb, BLOCK_N=min(_tile(dstate), 128), BLOCK_C=block_c, F32_DOT=f32_dot, num_warps=4)

    block_s = 4096 if whole else PASSING_BLOCK
    has_init = initial_states is not None
    init = initial_states if has_init else final
    _state_passing_kernel[(triton.cdiv(head_dim * dstate, block_s), sequences, heads)](
        states, entering, decays, init, final, seq_first, seq_count, head_dim * dstate,
        init.stride(0), init.stride(1), final.stride(0), final.stride(1),
        HAS_INIT=has_init, BLOCK_S=block_s, num_warps=4)

    out_m, out_k, out_warps, out_stages = OUTPUT_TILES
    block_m = block_c if whole else min(block_c, out_m)
    block_po = _tile(head_dim) if whole else min(_tile(head_dim), 64)
    block_kn = min(_tile(dstate), 128)
    block_k = block_c if whole else min(block_c, out_k)
    has_d, has_z = D is not None, z is not None
    d = D if has_d else A
    zz = z if has_z else x
    grid = (triton.cdiv(block_c, block_m) * triton.cdiv(head_dim, block_po), *_chunks_by_heads(bound, heads))
    _chunk_output_kernel[grid](
        x, C, cb, zz, d, out, steps, cums, entering, chunk_start, chunk_len, head_dim, dstate, ratio,
        x.stride(0), x.stride(1), x.stride(2), C.stride(0), C.stride(1), C.stride(2),
        zz.stride(0), zz.stride(1), zz.stride(2),
        out.stride(0), out.stride(1), d.stride(0), d.stride(-1) if d.dim() == 2 else 0,
        HAS_D=has_d, HAS_Z=has_z, BLOCK_M=block_m, BLOCK_P=block_po, BLOCK_K=block_k, BLOCK_N=block_kn,
        BLOCK_C=block_c, F32_DOT=f32_dot, ONE_N=dstate <= block_kn, HEADS_FIRST=HEADS_FIRST,
        num_warps=out_warps, num_stages=out_stages)
    return out, final


# Tiles of the two kernels a long prefill spends its time in, module-level so that
# ``python3 -m benchmarks scan_tiles mamba_chunk_scan`` can sweep them: the state pass's elements per program,
# and the output kernel's (rows, tokens per inner step, warps, pipeline stages).
PASSING_BLOCK = 512
OUTPUT_TILES = (64, 32, 4, 3)
# Grid order of the chunk-state and output kernels: with the heads on the grid's second axis,
# programs that run together share a chunk, so its B, C and C . B are read from L2 by every head.
HEADS_FIRST = True


def _chunks_by_heads(chunks: int, heads: int):
    return (heads, chunks) if HEADS_FIRST else (chunks, heads)


def _tile(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


if triton is not None:

    @triton.jit
    def _operand(t, like_ptr, F32_DOT: tl.constexpr):
        """A GEMM operand: rounded to the activations' dtype, then upcast where dots run in float32."""
        t = t.to(like_ptr.dtype.element_ty)
        if F32_DOT:
            t = t.to(tl.float32)
        return t

    @triton.jit
    def _chunk_and_head(HEADS_FIRST: tl.constexpr):
        """(chunk, head, heads) of a program on a grid laid out by ``_chunks_by_heads``."""
        if HEADS_FIRST:
            return tl.program_id(2), tl.program_id(1), tl.num_programs(1)
        return tl.program_id(1), tl.program_id(2), tl.num_programs(2)

    @triton.jit
    def _step_kernel(dt_ptr, bias_ptr, a_ptr, steps_ptr, cums_ptr, decays_ptr, start_ptr, len_ptr, heads,
                     stride_dt_t, stride_dt_h, stride_bias, dt_min, dt_max,
                     HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, BLOCK_H: tl.constexpr,
                     BLOCK_C: tl.constexpr):
        chunk = tl.program_id(0)
        length = tl.load(len_ptr + chunk)
        if length == 0:
            return
        start = tl.load(start_ptr + chunk).to(tl.int64)
        hs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        ts = tl.arange(0, BLOCK_C)
        h_ok = hs < heads
        live = h_ok[:, None] & (ts < length)[None, :]
        dt = tl.load(dt_ptr + (start + ts)[None, :] * stride_dt_t + hs[:, None] * stride_dt_h,
                     mask=live, other=0.0).to(tl.float32)
        if HAS_BIAS:
            dt += tl.load(bias_ptr + hs * stride_bias, mask=h_ok, other=0.0).to(tl.float32)[:, None]
        if SOFTPLUS:
            dt = tl.where(dt <= 20.0, tl.log(1.0 + tl.exp(dt)), dt)
        dt = tl.minimum(tl.maximum(dt, dt_min), dt_max)
        dt = tl.where(live, dt, 0.0)  # padding steps neither decay nor add
        a = tl.load(a_ptr + hs, mask=h_ok, other=0.0)
        cum = tl.cumsum(dt * a[:, None], axis=1)
        offs = (chunk * heads + hs)[:, None].to(tl.int64) * BLOCK_C + ts[None, :]
        tl.store(steps_ptr + offs, dt, mask=h_ok[:, None])
        tl.store(cums_ptr + offs, cum, mask=h_ok[:, None])
        # the whole chunk's decay: the state pass reads it without first reading the chunk's length
        total = tl.sum(tl.where((ts == length - 1)[None, :], cum, 0.0), axis=1)
        tl.store(decays_ptr + chunk * heads + hs, tl.exp(total), mask=h_ok)

    @triton.jit
    def _chunk_state_kernel(x_ptr, b_ptr, steps_ptr, cums_ptr, states_ptr, start_ptr, len_ptr,
                            head_dim, dstate, ratio, sx_t, sx_h, sx_p, sb_t, sb_g, sb_n,
                            BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            BLOCK_C: tl.constexpr, F32_DOT: tl.constexpr, HEADS_FIRST: tl.constexpr):
        chunk, head, heads = _chunk_and_head(HEADS_FIRST)
        length = tl.load(len_ptr + chunk)
        if length == 0:
            return
        tiles_n = tl.cdiv(dstate, BLOCK_N)
        ps = (tl.program_id(0) // tiles_n) * BLOCK_P + tl.arange(0, BLOCK_P)
        ns = (tl.program_id(0) % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
        start = tl.load(start_ptr + chunk).to(tl.int64)
        row = (chunk * heads + head).to(tl.int64) * BLOCK_C
        last = tl.load(cums_ptr + row + length - 1)
        x_base = x_ptr + start * sx_t + head * sx_h
        b_base = b_ptr + start * sb_t + (head // ratio) * sb_g
        acc = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, length, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < length
            xk = tl.load(x_base + ks[:, None] * sx_t + ps[None, :] * sx_p,
                         mask=k_ok[:, None] & (ps < head_dim)[None, :], other=0.0)
            bk = tl.load(b_base + ks[:, None] * sb_t + ns[None, :] * sb_n,
                         mask=k_ok[:, None] & (ns < dstate)[None, :], other=0.0)
            # weight of token k in the chunk's end state: its step and the decay after it
            w = tl.load(steps_ptr + row + ks, mask=k_ok, other=0.0) * \
                tl.exp(last - tl.load(cums_ptr + row + ks, mask=k_ok, other=0.0))
            xw = _operand(xk.to(tl.float32) * w[:, None], x_ptr, F32_DOT)
            acc += tl.dot(tl.trans(xw), _operand(bk, x_ptr, F32_DOT), input_precision="ieee")
        offs = (chunk * heads + head).to(tl.int64) * head_dim * dstate + ps[:, None] * dstate + ns[None, :]
        tl.store(states_ptr + offs, acc, mask=(ps < head_dim)[:, None] & (ns < dstate)[None, :])

    @triton.jit
    def _chunk_cb_kernel(b_ptr, c_ptr, cb_ptr, start_ptr, len_ptr, dstate, sb_t, sb_g, sb_n, sc_t, sc_g, sc_n, like_ptr,
                         BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, F32_DOT: tl.constexpr):
        chunk = tl.program_id(1)
        length = tl.load(len_ptr + chunk)
        tiles = tl.cdiv(BLOCK_C, BLOCK)
        m0 = (tl.program_id(0) // tiles) * BLOCK
        k0 = (tl.program_id(0) % tiles) * BLOCK
        if m0 >= length:  # past the chunk's tokens: discarded by the output kernel's causal select
            return
        group = tl.program_id(2)
        groups = tl.num_programs(2)
        start = tl.load(start_ptr + chunk).to(tl.int64)
        ms = m0 + tl.arange(0, BLOCK)
        ks = k0 + tl.arange(0, BLOCK)
        m_ok, k_ok = ms < length, ks < length
        offs = (chunk * groups + group).to(tl.int64) * BLOCK_C * BLOCK_C + ms[:, None] * BLOCK_C + ks[None, :]
        if k0 > m0:  # wholly above the diagonal: discarded by the output kernel's causal select
            return
        c_base = c_ptr + start * sc_t + group * sc_g
        b_base = b_ptr + start * sb_t + group * sb_g
        acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
        for n0 in range(0, dstate, BLOCK_N):
            ns = n0 + tl.arange(0, BLOCK_N)
            n_ok = ns < dstate
            cm = tl.load(c_base + ms[:, None] * sc_t + ns[None, :] * sc_n, mask=m_ok[:, None] & n_ok[None, :],
                         other=0.0)
            bk = tl.load(b_base + ks[None, :] * sb_t + ns[:, None] * sb_n, mask=n_ok[:, None] & k_ok[None, :],
                         other=0.0)
            acc += tl.dot(_operand(cm, like_ptr, F32_DOT), _operand(bk, like_ptr, F32_DOT), input_precision="ieee")
        tl.store(cb_ptr + offs, acc, mask=m_ok[:, None] & k_ok[None, :])

    @triton.jit
    def _state_passing_kernel(states_ptr, entering_ptr, decays_ptr, init_ptr, final_ptr, first_ptr, count_ptr,
                              size, si_s, si_h, sf_s, sf_h, HAS_INIT: tl.constexpr, BLOCK_S: tl.constexpr):
        seq = tl.program_id(1)
        head = tl.program_id(2)
        heads = tl.num_programs(2)
        es = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)  # flattened (p, n) elements
        ok = es < size
        if HAS_INIT:
            carried = tl.load(init_ptr + seq.to(tl.int64) * si_s + head * si_h + es, mask=ok, other=0.0)
            carried = carried.to(tl.float32)
        else:
            carried = tl.zeros((BLOCK_S,), dtype=tl.float32)
        first = tl.load(first_ptr + seq)
        count = tl.load(count_ptr + seq)
        # one chunk ahead: the next chunk's state and decay are in flight while this one is combined
        # and stored, so the serial walk does not wait a full memory latency per chunk. An empty
        # sequence reads row 0 and never uses it; the last chunk re-reads itself rather than read past.
        row = tl.where(count > 0, first.to(tl.int64) * heads + head, 0)
        own = tl.load(states_ptr + row * size + es, mask=ok, other=0.0)
        decay = tl.load(decays_ptr + row)
        for i in range(0, count):
            nxt = tl.where(i + 1 < count, row + heads, row)
            own_next = tl.load(states_ptr + nxt * size + es, mask=ok, other=0.0)
            decay_next = tl.load(decays_ptr + nxt)
            tl.store(entering_ptr + row * size + es, carried.to(entering_ptr.dtype.element_ty), mask=ok)
            carried = decay * carried + own
            row, own, decay = nxt, own_next, decay_next
        tl.store(final_ptr + seq.to(tl.int64) * sf_s + head * sf_h + es,
                 carried.to(final_ptr.dtype.element_ty), mask=ok)

    @triton.jit
    def _chunk_output_kernel(x_ptr, c_ptr, cb_ptr, z_ptr, d_ptr, out_ptr, steps_ptr, cums_ptr, states_ptr,
                             start_ptr, len_ptr, head_dim, dstate, ratio,
                             sx_t, sx_h, sx_p, sc_t, sc_g, sc_n, sz_t, sz_h, sz_p,
                             so_t, so_h, sd_h, sd_p,
                             HAS_D: tl.constexpr, HAS_Z: tl.constexpr, BLOCK_M: tl.constexpr,
                             BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
                             BLOCK_C: tl.constexpr, F32_DOT: tl.constexpr, ONE_N: tl.constexpr,
                             HEADS_FIRST: tl.constexpr):
        chunk, head, heads = _chunk_and_head(HEADS_FIRST)
        length = tl.load(len_ptr + chunk)
        tiles_p = tl.cdiv(head_dim, BLOCK_P)
        m0 = (tl.program_id(0) // tiles_p) * BLOCK_M
        if m0 >= length:
            return
        ms = m0 + tl.arange(0, BLOCK_M)
        ps = (tl.program_id(0) % tiles_p) * BLOCK_P + tl.arange(0, BLOCK_P)
        m_ok, p_ok = ms < length, ps < head_dim
        start = tl.load(start_ptr + chunk).to(tl.int64)
        row = (chunk * heads + head).to(tl.int64) * BLOCK_C
        cum_m = tl.load(cums_ptr + row + ms, mask=m_ok, other=0.0)
        group = head // ratio
        c_base = c_ptr + start * sc_t + group * sc_g
        groups = heads // ratio
        cb_base = cb_ptr + (chunk * groups + group).to(tl.int64) * BLOCK_C * BLOCK_C
        x_base = x_ptr + start * sx_t + head * sx_h
        state_base = states_ptr + (chunk * heads + head).to(tl.int64) * head_dim * dstate
        acc = tl.zeros((BLOCK_M, BLOCK_P), dtype=tl.float32)
        if ONE_N:  # the whole state width in one tile (Mamba-2's 128): the rows' C is loaded once
            ns = tl.arange(0, BLOCK_N)
            c_rows = tl.load(c_base + ms[:, None] * sc_t + ns[None, :] * sc_n,
                             mask=m_ok[:, None] & (ns < dstate)[None, :], other=0.0)
        # what the state entering the chunk contributes, decayed to each row: exp(cs_m) C_m . s
        for n0 in range(0, dstate, BLOCK_N):
            ns = n0 + tl.arange(0, BLOCK_N)
            n_ok = ns < dstate
            if ONE_N:
                cm = c_rows
            else:
                cm = tl.load(c_base + ms[:, None] * sc_t + ns[None, :] * sc_n, mask=m_ok[:, None] & n_ok[None, :],
                             other=0.0)
            s = tl.load(state_base + ps[None, :] * dstate + ns[:, None], mask=n_ok[:, None] & p_ok[None, :],
                        other=0.0)
            acc += tl.dot(_operand(cm, x_ptr, F32_DOT), _operand(s, x_ptr, F32_DOT), input_precision="ieee")
        acc *= tl.exp(cum_m)[:, None]
        # the chunk's own tokens up to each row: (C_m . B_k) exp(cs_m - cs_k) dt_k x_k, k <= m, C . B read
        # from the group's table
        for k0 in range(0, tl.minimum(m0 + BLOCK_M, length), BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < length
            causal = (ks[None, :] <= ms[:, None]) & k_ok[None, :] & m_ok[:, None]
            # C . B, cs and dt sit in tables padded to BLOCK_C, so every (m, k) here is in bounds: loaded
            # without a mask (one on the contiguous k axis, from a length read at run time, split each
            # row into scalar loads: this kernel took 1263.8 us on 32768 tokens with it and 877.5
            # without, on an H100 on 2026-12-07). C . B past the chunk's tokens and above the diagonal
            # is never written and may be anything (NaN, inf): the causal select takes 0 there before
            # any product, and exp(0) where cs_m - cs_k > 0 could overflow (on the CPU, NumPy warns of
            # an overflow or an inf * 0 even in lanes a select discards).
            cb = tl.where(causal, tl.load(cb_base + ms[:, None] * BLOCK_C + ks[None, :]), 0.0)
            cum_k = tl.load(cums_ptr + row + ks)
            dt_k = tl.load(steps_ptr + row + ks)
            decay = tl.exp(tl.where(causal, cum_m[:, None] - cum_k[None, :], 0.0))
            weights = cb * decay * dt_k[None, :]
            xk = tl.load(x_base + ks[:, None] * sx_t + ps[None, :] * sx_p, mask=k_ok[:, None] & p_ok[None, :],
                         other=0.0)
            acc += tl.dot(_operand(weights, x_ptr, F32_DOT), _operand(xk, x_ptr, F32_DOT), input_precision="ieee")
        out_mask = m_ok[:, None] & p_ok[None, :]
        xm = tl.load(x_base + ms[:, None] * sx_t + ps[None, :] * sx_p, mask=out_mask, other=0.0).to(tl.float32)
        if HAS_D:
            acc += xm * tl.load(d_ptr + head * sd_h + ps * sd_p, mask=p_ok, other=0.0).to(tl.float32)[None, :]
        if HAS_Z:
            zm = tl.load(z_ptr + (start + ms[:, None]) * sz_t + head * sz_h + ps[None, :] * sz_p, mask=out_mask,
                         other=0.0).to(tl.float32)
            acc *= zm * tl.sigmoid(zm)
        tl.store(out_ptr + (start + ms[:, None]) * so_t + head * so_h + ps[None, :], acc.to(out_ptr.dtype.element_ty),
                 mask=out_mask)
