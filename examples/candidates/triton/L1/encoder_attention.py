"""Bidirectional encoder attention in Triton: one flash-attention kernel (online softmax, no causal
mask) over sequences given by start offsets, for both layers.

``EncoderOnlyAttention`` hands it the packed batch and the forward context's cu_seqlens;
``MultiHeadAttention`` hands it the padded batch as rows ``b * S + i`` with starts ``b * S`` and a
per-key flag from the padding mask, so padded keys take no part and padded query rows attend to the
real keys like the others. A program owns a block of one sequence's queries for one query head
(a few heads in the interpreter) and sweeps that sequence's keys with a running max and sum, so no
score matrix is ever stored; a grouped-query head reads its shared K/V head in place.

Numerics: q.k on the inputs' dtype with float32 accumulation, softmax statistics and p.v in
float32 (p.v in TF32 for the half types, whose values TF32 holds exactly; full float32 products
for float32 inputs), one rounding of the normalised output.
"""
import torch
import triton
import triton.language as tl
from torch import nn

from kernels_reference.forward_context import get_forward_context

LOG2E = 1.4426950408889634
# Interpreter tiles: up to this many (head, query) rows a program. More heads a program means fewer
# programs (the interpreter's cost is per operation) but a dot wasted on the other heads' pairs.
# Eight packed sequences of 9-64 tokens, 12 heads of 32 (MiniLM's shape) on a 2-core CPU on
# 2026-12-07: 1.14 s a call at 64 rows, 0.59 at 128, 0.32 at 256, 0.29 at 512, 0.26 at 1024 (float32;
# bfloat16 0.32 at 512, 0.36 at 1024).
INTERPRETER_ROWS = 512


@triton.jit
def _flash_bidirectional(q_ptr, k_ptr, v_ptr, o_ptr, q_start_ptr, k_start_ptr, key_ok_ptr,
                         q_stride_t, q_stride_h, k_stride_t, k_stride_h, v_stride_t, v_stride_h,
                         o_stride_t, o_stride_h, num_heads, group, scale_log2,
                         HEAD: tl.constexpr, HEAD_PAD: tl.constexpr, HEADS: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, HAS_KEY_MASK: tl.constexpr, FLOAT32_DOTS: tl.constexpr):
    # Tile rows are (query head, query) pairs and columns (query head, key) pairs; a score counts
    # only where the two heads agree. With HEADS = 1 (the GPU) this is the plain flash kernel; the
    # interpreter, which pays per operation rather than per element, takes a few heads a program.
    block, seq, head_block = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    q_first = tl.load(q_start_ptr + seq)
    q_len = tl.load(q_start_ptr + seq + 1) - q_first
    if block * BLOCK_M >= q_len:  # this sequence is shorter than the longest: nothing to do
        return
    k_first = tl.load(k_start_ptr + seq)
    k_len = tl.load(k_start_ptr + seq + 1) - k_first

    r = tl.arange(0, HEADS * BLOCK_M)
    row_head = head_block * HEADS + r // BLOCK_M
    rows = block * BLOCK_M + r % BLOCK_M
    row_ok = (rows < q_len) & (row_head < num_heads)
    c = tl.arange(0, HEADS * BLOCK_N)
    col_head = head_block * HEADS + c // BLOCK_N
    col_kv_head = col_head // group
    dims = tl.arange(0, HEAD_PAD)
    dim_ok = dims < HEAD
    q_rows = (q_first + rows).to(tl.int64)
    q = tl.load(q_ptr + q_rows[:, None] * q_stride_t + row_head[:, None] * q_stride_h + dims[None, :],
                mask=row_ok[:, None] & dim_ok[None, :], other=0.0)

    best = tl.full([HEADS * BLOCK_M], float("-inf"), tl.float32)
    total = tl.zeros([HEADS * BLOCK_M], tl.float32)
    acc = tl.zeros([HEADS * BLOCK_M, HEAD_PAD], tl.float32)
    for start in range(0, k_len, BLOCK_N):
        keys = start + c % BLOCK_N
        key_ok = (keys < k_len) & (col_head < num_heads)
        k_rows = (k_first + keys).to(tl.int64)
        if HAS_KEY_MASK:
            key_ok = key_ok & (tl.load(key_ok_ptr + k_rows, mask=key_ok, other=0) != 0)
        kt = tl.load(k_ptr + k_rows[None, :] * k_stride_t + col_kv_head[None, :] * k_stride_h + dims[:, None],
                     mask=key_ok[None, :] & dim_ok[:, None], other=0.0)
        # base-2 exponent: exp(x * scale) = exp2(x * scale * log2(e))
        if FLOAT32_DOTS:
            s = tl.dot(q.to(tl.float32), kt.to(tl.float32), input_precision="ieee") * scale_log2
        else:
            s = tl.dot(q, kt) * scale_log2
        s = tl.where((row_head[:, None] == col_head[None, :]) & key_ok[None, :], s, float("-inf"))
        new_best = tl.maximum(best, tl.max(s, axis=1))
        # Rows that have seen no valid key yet keep -inf; shift them by 0 so exp2 gives 0, not NaN.
        shift = tl.where(new_best == float("-inf"), 0.0, new_best)
        p = tl.exp2(s - shift[:, None])
        rescale = tl.exp2(best - shift)
        total = total * rescale + tl.sum(p, axis=1)
        v = tl.load(v_ptr + k_rows[:, None] * v_stride_t + col_kv_head[:, None] * v_stride_h + dims[None, :],
                    mask=key_ok[:, None] & dim_ok[None, :], other=0.0).to(tl.float32)
        if FLOAT32_DOTS:
            pv = tl.dot(p, v, input_precision="ieee")
        else:
            pv = tl.dot(p, v, input_precision="tf32")
        acc = acc * rescale[:, None] + pv
        best = new_best
    out = acc / tl.where(total > 0, total, 1.0)[:, None]  # a row with no valid key: zeros
    tl.store(o_ptr + q_rows[:, None] * o_stride_t + row_head[:, None] * o_stride_h + dims[None, :],
             out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])


def _heads(x, heads, head_size):
    """[rows, heads * d] as a [rows, heads, d] view; copied only when the last dimension is strided."""
    x = x.reshape(-1, heads, head_size)
    return x if x.stride(-1) == 1 else x.contiguous()


def attend(q, k, v, q_starts, k_starts, longest, scale, key_ok=None):
    """q [Tq, nq, d], k/v [Tk, nk, d] rows; sequence i is rows starts[i]..starts[i+1] of each.
    ``key_ok`` [Tk] int8 (nonzero = attend) or None. Returns [Tq, nq, d]."""
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    n_seqs = q_starts.numel() - 1
    if q.shape[0] == 0 or n_seqs == 0:
        return out
    d, nq = q.shape[2], q.shape[1]
    head_pad = max(16, triton.next_power_of_2(d))
    if q.is_cuda:
        heads, block_m, block_n = 1, 64, 64 if head_pad <= 64 else 32
    else:  # the interpreter pays per operation: whole short sequences, several heads a program
        block_m = block_n = min(128, max(16, triton.next_power_of_2(longest)))
        heads = max(1, min(triton.next_power_of_2(nq), INTERPRETER_ROWS // block_m))
    # Exact float32 products for float32 inputs, and in the interpreter, which multiplies half
    # tiles wrongly (products of half values are exact in float32, so nothing is lost).
    float32_dots = q.dtype == torch.float32 or not q.is_cuda
    grid = (triton.cdiv(longest, block_m), n_seqs, triton.cdiv(nq, heads))
    _flash_bidirectional[grid](
        q, k, v, out, q_starts, k_starts, key_ok if key_ok is not None else q_starts,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
        nq, nq // k.shape[1], scale * LOG2E,
        HEAD=d, HEAD_PAD=head_pad, HEADS=heads, BLOCK_M=block_m, BLOCK_N=block_n, HAS_KEY_MASK=key_ok is not None,
        FLOAT32_DOTS=float32_dots, num_warps=4)
    return out


class EncoderOnlyAttention(nn.Module):
    def __init__(self, num_heads, head_size, scale, num_kv_heads=None):
        super().__init__()
        self.num_heads, self.head_size, self.scale = num_heads, head_size, scale
        self.num_kv_heads = num_kv_heads or num_heads

    def forward(self, query, key, value):
        t = query.shape[0]
        meta = get_forward_context()
        if meta is None:  # no metadata: the whole batch is one sequence
            starts, longest = torch.tensor([0, t], dtype=torch.int32, device=query.device), t
        else:
            starts, longest = meta.query_start_loc.to(torch.int32), meta.max_query_len
        q = _heads(query, self.num_heads, self.head_size)
        k = _heads(key, self.num_kv_heads, self.head_size)
        v = _heads(value, self.num_kv_heads, self.head_size)
        return attend(q, k, v, starts, starts, longest, self.scale).reshape(t, -1)


class MultiHeadAttention(nn.Module):
    def __init__(self, num_heads, head_size, scale, num_kv_heads=None):
        super().__init__()
        self.num_heads, self.head_size, self.scale = num_heads, head_size, scale
        self.num_kv_heads = num_kv_heads or num_heads

    def forward(self, query, key, value, attention_mask=None):
        b, s, kv_len = query.shape[0], query.shape[1], key.shape[1]
        q = _heads(query, self.num_heads, self.head_size)  # rows b * S + i
        k = _heads(key, self.num_kv_heads, self.head_size)
        v = _heads(value, self.num_kv_heads, self.head_size)
        q_starts = torch.arange(0, (b + 1) * s, s, dtype=torch.int32, device=query.device)
        k_starts = torch.arange(0, (b + 1) * kv_len, kv_len, dtype=torch.int32, device=query.device)
        key_ok = None if attention_mask is None else attention_mask.reshape(-1).to(torch.int8)
        return attend(q, k, v, q_starts, k_starts, s, self.scale, key_ok).reshape(b, s, -1)
