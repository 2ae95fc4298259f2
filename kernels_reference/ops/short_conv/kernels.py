"""Triton kernels of the causal depthwise convolution (prefill over packed sequences, decode step).

Prefill is two launches. The first tiles the packed token dimension (not each sequence), so a batch
of many short sequences fills the GPU as well as one long one, and it needs no host-side list of
tiles: each token finds its sequence by a binary search over ``query_start_loc`` in the kernel
(log2(batch) small loads), which keeps the launch free of host synchronisation and capturable in a
CUDA graph. Every tap is a shifted load of the same tile; the K - 1 overlapping rows come from L1/L2,
so DRAM sees each input about once. A tap that reaches before its sequence's first token reads the
sequence's initial state instead (or zero for a fresh sequence), so nothing leaks between
neighbouring sequences of the packed batch. The second launch writes each sequence's new state
(its last K - 1 window rows); it must run after the first, which reads the old states.

Decode is one launch: one program per (sequence, channel block) reads the K - 1 state rows and the
new token, writes the output and shifts the state in place.

Accumulation, bias and SiLU in float32; one rounding to the output dtype.
"""
from typing import Optional

import torch

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

from ...triton_rows import interpreting


def _tiles(device_tensor: torch.Tensor):
    """(tokens per program, channels per program, warps) of the prefill kernel.

    On a GPU a 64 x 128 tile (8K elements, 4 warps: 16 bf16 loads per thread per tap) keeps
    enough programs in flight at decode-like batch sizes while amortising the K tap loads; the
    interpreter pays per program, so it takes whole rows and twice the tokens."""
    if device_tensor.is_cuda and not interpreting():
        return 64, 128, 4
    return 128, 1024, 4


def short_conv_prefill(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                       conv_states: torch.Tensor, query_start_loc: torch.Tensor,
                       cache_indices: Optional[torch.Tensor], has_initial_state: Optional[torch.Tensor],
                       activation: Optional[str]) -> torch.Tensor:
    """x [T, D] (rows may be strided, channels contiguous); weight [D, K]; conv_states
    [slots, K - 1, D] with contiguous channels, updated in place. Returns out [T, D]."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    tokens, dim = x.shape
    width = weight.shape[-1]
    n_seq = query_start_loc.numel() - 1
    out = torch.empty((tokens, dim), dtype=x.dtype, device=x.device)
    if n_seq == 0:
        return out
    slots = cache_indices if cache_indices is not None else \
        torch.arange(n_seq, dtype=torch.int32, device=x.device)
    flags = has_initial_state if has_initial_state is not None else \
        torch.zeros(n_seq, dtype=torch.bool, device=x.device)
    flags = flags.to(torch.int8)  # bool pointers load as int1 on some Triton versions, int8 on all
    states = conv_states
    if states.stride(-1) != 1:
        raise ValueError("ShortConvolution needs conv states with contiguous channels")
    block_t, block_d, warps = _tiles(x)
    block_d = min(block_d, triton.next_power_of_2(dim))
    has_bias = bias is not None
    if tokens:
        grid = (triton.cdiv(tokens, block_t), triton.cdiv(dim, block_d))
        _short_conv_prefill_kernel[grid](
            x, weight, bias if has_bias else weight, states, query_start_loc, slots, flags, out,
            tokens, dim, n_seq, n_seq.bit_length(),
            x.stride(0), weight.stride(0), weight.stride(1),
            states.stride(0), states.stride(1), out.stride(0),
            WIDTH=width, HAS_BIAS=has_bias, SILU=activation in ("silu", "swish"),
            BLOCK_T=block_t, BLOCK_D=block_d, num_warps=warps)
    state_block = min(triton.next_power_of_2(dim), 1024 if interpreting() or not x.is_cuda else 256)
    _short_conv_state_kernel[(n_seq, triton.cdiv(dim, state_block))](
        x, states, query_start_loc, slots, flags, dim,
        x.stride(0), states.stride(0), states.stride(1),
        WIDTH=width, ROWS=triton.next_power_of_2(max(width - 1, 1)), BLOCK_D=state_block,
        num_warps=2)
    return out


def short_conv_decode(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                      conv_states: torch.Tensor, cache_indices: Optional[torch.Tensor],
                      activation: Optional[str]) -> torch.Tensor:
    """x [B, D], one new token per sequence; conv_states [slots, K - 1, D], shifted in place."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    batch, dim = x.shape
    width = weight.shape[-1]
    out = torch.empty((batch, dim), dtype=x.dtype, device=x.device)
    if batch == 0:
        return out
    slots = cache_indices if cache_indices is not None else \
        torch.arange(batch, dtype=torch.int32, device=x.device)
    if conv_states.stride(-1) != 1:
        raise ValueError("ShortConvolution needs conv states with contiguous channels")
    # A decode step is pure state traffic: 256 channels (512 bytes of bf16 per state row) per
    # program spreads even one sequence over dim / 256 programs.
    block_d = min(triton.next_power_of_2(dim), 1024 if interpreting() or not x.is_cuda else 256)
    has_bias = bias is not None
    _short_conv_decode_kernel[(batch, triton.cdiv(dim, block_d))](
        x, weight, bias if has_bias else weight, conv_states, slots, out, dim,
        x.stride(0), weight.stride(0), weight.stride(1),
        conv_states.stride(0), conv_states.stride(1), out.stride(0),
        WIDTH=width, ROWS=triton.next_power_of_2(max(width - 1, 1)), HAS_BIAS=has_bias,
        SILU=activation in ("silu", "swish"), BLOCK_D=block_d, num_warps=2)
    return out


if triton is not None:

    @triton.jit
    def _short_conv_prefill_kernel(
            x_ptr, w_ptr, b_ptr, state_ptr, qsl_ptr, slot_ptr, init_ptr, out_ptr,
            n_tokens, dim, n_seq, search_steps,
            sx_t, sw_d, sw_k, ss_slot, ss_row, so_t,
            WIDTH: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
            BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
        tok = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        ch = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        tok_ok = tok < n_tokens
        ch_ok = ch < dim
        # The sequence of each token: the first s with query_start_loc[s + 1] > tok (empty
        # sequences are skipped by the same rule). lo == hi ends the search early per lane.
        lo = tl.zeros((BLOCK_T,), dtype=tl.int32)
        hi = tl.zeros((BLOCK_T,), dtype=tl.int32) + n_seq
        for _ in range(search_steps):
            mid = (lo + hi) // 2
            active = mid < hi
            bound = tl.load(qsl_ptr + mid + 1, mask=active, other=0)
            right = active & (bound <= tok)
            lo = tl.where(right, mid + 1, lo)
            hi = tl.where(active & ~right, mid, hi)
        seq = tl.minimum(lo, n_seq - 1)  # tokens past the end: any valid sequence, masked below
        start = tl.load(qsl_ptr + seq, mask=tok_ok, other=0)
        with_state = tl.load(init_ptr + seq, mask=tok_ok, other=0) != 0
        slot = tl.load(slot_ptr + seq, mask=tok_ok, other=0).to(tl.int64)

        acc = tl.zeros((BLOCK_T, BLOCK_D), dtype=tl.float32)
        if HAS_BIAS:
            acc += tl.load(b_ptr + ch, mask=ch_ok, other=0.0).to(tl.float32)[None, :]
        tok64 = tok.to(tl.int64)
        for tap in tl.static_range(WIDTH):
            back = WIDTH - 1 - tap  # this tap reads the input `back` tokens before the output's
            src = tok64 - back
            in_seq = src >= start
            m_x = (tok_ok & in_seq)[:, None] & ch_ok[None, :]
            v = tl.load(x_ptr + src[:, None] * sx_t + ch[None, :], mask=m_x, other=0.0).to(tl.float32)
            if back > 0:  # taps before the sequence's first token come from its state row
                row = WIDTH - 1 + (src - start)  # 0 .. K - 2 where src < start
                m_s = (tok_ok & ~in_seq & with_state)[:, None] & ch_ok[None, :]
                v += tl.load(state_ptr + (slot * ss_slot + row * ss_row)[:, None] + ch[None, :],
                             mask=m_s, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + ch * sw_d + tap * sw_k, mask=ch_ok, other=0.0).to(tl.float32)
            acc += v * w[None, :]
        if SILU:
            acc = acc * tl.sigmoid(acc)
        tl.store(out_ptr + tok64[:, None] * so_t + ch[None, :], acc.to(out_ptr.dtype.element_ty),
                 mask=tok_ok[:, None] & ch_ok[None, :])

    @triton.jit
    def _short_conv_state_kernel(x_ptr, state_ptr, qsl_ptr, slot_ptr, init_ptr, dim,
                                 sx_t, ss_slot, ss_row,
                                 WIDTH: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
        seq = tl.program_id(0)
        ch = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        ch_ok = ch < dim
        start = tl.load(qsl_ptr + seq).to(tl.int64)
        length = tl.load(qsl_ptr + seq + 1).to(tl.int64) - start
        base = state_ptr + tl.load(slot_ptr + seq).to(tl.int64) * ss_slot
        row = tl.arange(0, ROWS)
        with_state = tl.load(init_ptr + seq + row * 0) != 0  # the flag per row: a vector mask
        row_ok = row < WIDTH - 1
        # New state row r is window row length + r of [old state (K - 1 rows) | the inputs].
        pos = length + row
        from_x = pos >= WIDTH - 1
        m_x = (row_ok & from_x)[:, None] & ch_ok[None, :]
        new = tl.load(x_ptr + (start + pos - (WIDTH - 1))[:, None] * sx_t + ch[None, :], mask=m_x, other=0.0)
        m_s = (row_ok & (pos < WIDTH - 1) & with_state)[:, None] & ch_ok[None, :]
        kept = tl.load(base + pos[:, None] * ss_row + ch[None, :], mask=m_s, other=0.0)
        new = tl.where(m_x, new.to(state_ptr.dtype.element_ty), kept)
        tl.debug_barrier()  # row r is read (as row length + r') by another lane than the one writing it
        tl.store(base + row[:, None] * ss_row + ch[None, :], new, mask=row_ok[:, None] & ch_ok[None, :])

    @triton.jit
    def _short_conv_decode_kernel(x_ptr, w_ptr, b_ptr, state_ptr, slot_ptr, out_ptr, dim,
                                  sx_b, sw_d, sw_k, ss_slot, ss_row, so_b,
                                  WIDTH: tl.constexpr, ROWS: tl.constexpr, HAS_BIAS: tl.constexpr,
                                  SILU: tl.constexpr, BLOCK_D: tl.constexpr):
        seq = tl.program_id(0)
        ch = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        ch_ok = ch < dim
        base = state_ptr + tl.load(slot_ptr + seq).to(tl.int64) * ss_slot
        row = tl.arange(0, ROWS)
        row_ok = (row < WIDTH - 1)[:, None] & ch_ok[None, :]
        old = tl.load(base + row[:, None] * ss_row + ch[None, :], mask=row_ok, other=0.0)
        new_x = tl.load(x_ptr + seq.to(tl.int64) * sx_b + ch, mask=ch_ok, other=0.0)
        # Taps 0 .. K - 2 read the state rows, tap K - 1 the new token.
        w_old = tl.load(w_ptr + ch[None, :] * sw_d + row[:, None] * sw_k, mask=row_ok, other=0.0)
        w_new = tl.load(w_ptr + ch * sw_d + (WIDTH - 1) * sw_k, mask=ch_ok, other=0.0)
        acc = tl.sum(old.to(tl.float32) * w_old.to(tl.float32), axis=0) + new_x.to(tl.float32) * w_new.to(tl.float32)
        if HAS_BIAS:
            acc += tl.load(b_ptr + ch, mask=ch_ok, other=0.0).to(tl.float32)
        if SILU:
            acc = acc * tl.sigmoid(acc)
        tl.store(out_ptr + seq.to(tl.int64) * so_b + ch, acc.to(out_ptr.dtype.element_ty), mask=ch_ok)
        # The state moves up one row and the new token becomes its last row: row r takes old row
        # r + 1, read again from the state (no register shuffle across rows); loads precede stores.
        shifted = tl.load(base + (row + 1)[:, None] * ss_row + ch[None, :],
                          mask=(row + 1 < WIDTH - 1)[:, None] & ch_ok[None, :], other=0.0)
        shifted = tl.where((row == WIDTH - 2)[:, None], new_x.to(state_ptr.dtype.element_ty)[None, :], shifted)
        tl.debug_barrier()  # every lane's reads of the old rows land before any lane overwrites them
        tl.store(base + row[:, None] * ss_row + ch[None, :], shifted, mask=row_ok)
