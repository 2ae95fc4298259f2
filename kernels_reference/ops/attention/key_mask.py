"""Bidirectional attention over a padded batch with a key-padding mask, in one Triton launch that
reads only the span of each entry's valid keys.

Status: one of ``MultiHeadAttention``'s timed options with a key mask, kept by its first call on
MiniLM's and BGE-M3's padded batches on an H100 (2026-12-06, docs/perf/h100-2026-12-06f.md, graph
replays of ``python3 -m benchmarks key_mask_tiles``): 22.1 us on 8 MiniLM documents of 512 tokens
(flex_attention 20.9, cuDNN 35.1), 8.3 us on 32 of 128 (flex 10.0, cuDNN 18.3), 14.5 and 37.5 us on
BGE-M3's two batches (cuDNN 24.0 and 45.3).

``MultiHeadAttention`` with ``attention_mask`` (Hugging Face's BERT feeding a padded batch of
sentences) gives SDPA a boolean mask; every SDPA kernel then reads and scores the whole padded
square, and on an H100 (2026-12-05) cuDNN took 37.5 us on 8 MiniLM documents padded to 512 tokens
where flex_attention, which skips key blocks its block mask rules out, took 22.2 us. Here each
program first finds its entry's first and last valid key from the mask row (a few hundred bytes;
no extra launch, no host sync, so the call can be captured in a CUDA graph) and sweeps the key
blocks between them only. Keys masked inside that span are scored -inf, so any mask is computed
exactly; right-padded batches (what tokenizers produce) skip all of their padding. Every query row
is computed, padded ones included (they attend to their entry's valid keys, as the definition says).

Numerics as FlashAttention-2: q.k on the inputs' type with float32 accumulation, softmax statistics
in float32 (base-2 exponent), the probabilities rounded to the value type for p.v, one rounding of
the normalised output. In the CPU interpreter the products are float32 (it multiplies half tiles
wrongly; products of half values are exact in float32).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ...triton_rows import autotune, autotune_here, interpreting

try:
    import triton
    import triton.language as tl
except ImportError:  # the native path still works without Triton
    triton = None

LOG2E = 1.4426950408889634
# The interpreter pays per program and per operation: big tiles, one program per entry and head.
INTERPRETER_BLOCK = 64

if triton is not None:
    @triton.jit
    def _key_mask_attention(q_ptr, k_ptr, v_ptr, o_ptr, mask_ptr,
                            seq_q, seq_kv, num_heads, group, scale_log2,
                            q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, o_sb, o_ss, o_sh, m_sb, m_ss,
                            HEAD: tl.constexpr, HEAD_PAD: tl.constexpr, FLOAT32_DOTS: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SCAN: tl.constexpr):
        block, pair = tl.program_id(0), tl.program_id(1)
        entry = pair // num_heads
        head = pair % num_heads
        kv_head = head // group
        mask_row = mask_ptr + entry.to(tl.int64) * m_sb

        # The span of valid keys: [first, last] of the True flags of this entry's mask row.
        first = tl.zeros([], tl.int32) + seq_kv
        last = tl.zeros([], tl.int32) - 1
        for start in range(0, seq_kv, SCAN):
            idx = start + tl.arange(0, SCAN)
            ok = tl.load(mask_row + idx * m_ss, mask=idx < seq_kv, other=0) != 0
            first = tl.minimum(first, tl.min(tl.where(ok, idx, seq_kv), axis=0))
            last = tl.maximum(last, tl.max(tl.where(ok, idx, -1), axis=0))
        span_start = (first // BLOCK_N) * BLOCK_N
        span_end = last + 1

        rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < seq_q
        dims = tl.arange(0, HEAD_PAD)
        dim_ok = dims < HEAD
        q_base = q_ptr + entry.to(tl.int64) * q_sb + head * q_sh
        q = tl.load(q_base + rows[:, None].to(tl.int64) * q_ss + dims[None, :],
                    mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
        k_base = k_ptr + entry.to(tl.int64) * k_sb + kv_head * k_sh
        v_base = v_ptr + entry.to(tl.int64) * v_sb + kv_head * v_sh

        best = tl.full([BLOCK_M], float("-inf"), tl.float32)
        total = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_PAD], tl.float32)
        for start in range(span_start, span_end, BLOCK_N):
            keys = start + tl.arange(0, BLOCK_N)
            in_span = keys < span_end
            key_ok = in_span & (tl.load(mask_row + keys * m_ss, mask=in_span, other=0) != 0)
            # The mask as an additive bias per key: one fused multiply-add per score instead of a
            # multiply and a select (with head size 32 the softmax's per-score work, not the two
            # matmuls, bounds the kernel).
            bias = tl.where(key_ok, 0.0, float("-inf"))
            kt = tl.load(k_base + keys[None, :].to(tl.int64) * k_ss + dims[:, None],
                         mask=in_span[None, :] & dim_ok[:, None], other=0.0)
            if FLOAT32_DOTS:
                s = tl.dot(q.to(tl.float32), kt.to(tl.float32), input_precision="ieee")
            else:
                s = tl.dot(q, kt)
            s = s * scale_log2 + bias[None, :]
            new_best = tl.maximum(best, tl.max(s, axis=1))
            # A row that has seen no valid key yet keeps -inf: shift it by 0 so exp2 gives 0, not NaN.
            shift = tl.where(new_best == float("-inf"), 0.0, new_best)
            p = tl.exp2(s - shift[:, None])
            rescale = tl.exp2(best - shift)
            total = total * rescale + tl.sum(p, axis=1)
            v = tl.load(v_base + keys[:, None].to(tl.int64) * v_ss + dims[None, :],
                        mask=in_span[:, None] & dim_ok[None, :], other=0.0)
            acc = acc * rescale[:, None]
            if FLOAT32_DOTS:
                acc = tl.dot(p, v.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(p.to(v.dtype), v, acc)  # accumulated in the matmul: no separate add
            best = new_best
        out = acc / tl.where(total > 0, total, 1.0)[:, None]  # a mask row with no True: zeros
        o_base = o_ptr + entry.to(tl.int64) * o_sb + head * o_sh
        tl.store(o_base + rows[:, None].to(tl.int64) * o_ss + dims[None, :], out.to(o_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & dim_ok[None, :])

    # Tiles per head size and length, tuned once per key on its first call (which must come before
    # any CUDA-graph capture, as for every autotuned kernel here). On the H100 sweep of 2026-12-06
    # the autotuner's pick came within 0.4-8% of the sweep's fastest tile on the four padded encoder
    # batches (BGE-M3's B8 S512 the 8%: its best was 128 x 128 with 2 stages, not in this list).
    _key_mask_attention_tuned = autotune(
        configs=[triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
                 for m, n, w, s in ((128, 128, 4, 3), (64, 128, 4, 3), (128, 64, 4, 3), (128, 64, 8, 3),
                                    (64, 64, 4, 3), (128, 32, 4, 3))],
        key=["seq_q", "seq_kv", "HEAD_PAD"],
    )(_key_mask_attention)


def key_mask_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                       key_mask: torch.Tensor, tile: Optional[Tuple[int, int, int, int]] = None) -> torch.Tensor:
    """q [B, S, nq, d] over k/v [B, Skv, nk, d] (any strides with d contiguous; nq a multiple of
    nk), ``key_mask`` [B, Skv] bool (True = attend). Returns [B, S, nq, d] in q's dtype.
    ``tile``: (BLOCK_M, BLOCK_N, warps, stages) instead of the autotuner's (or the interpreter's)
    choice, for benchmarks/key_mask_tiles.py."""
    b, s, nq, d = q.shape
    skv, nk = k.shape[1], k.shape[2]
    if key_mask.shape != (b, skv) or key_mask.dtype != torch.bool:
        raise ValueError(f"key_mask must be bool [{b}, {skv}], got {key_mask.dtype} {tuple(key_mask.shape)}")
    if nq % nk:
        raise ValueError(f"{nq} query heads do not share {nk} key/value heads evenly")
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        return out
    flags = key_mask.view(torch.uint8)
    head_pad = max(16, triton.next_power_of_2(d))
    scan = min(1024, triton.next_power_of_2(skv))
    args = (q, k, v, out, flags, s, skv, nq, nq // nk, scale * LOG2E,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
            flags.stride(0), flags.stride(1))
    consts = dict(HEAD=d, HEAD_PAD=head_pad, SCAN=scan)
    if tile is None and autotune_here(q):
        grid = lambda meta: (triton.cdiv(s, meta["BLOCK_M"]), b * nq)  # noqa: E731
        _key_mask_attention_tuned[grid](*args, FLOAT32_DOTS=q.dtype == torch.float32, **consts)
        return out
    if tile is None:
        block = INTERPRETER_BLOCK if interpreting() else 64
        tile = (block, block, 4, 2)
    block_m, block_n, warps, stages = tile
    _key_mask_attention[(triton.cdiv(s, block_m), b * nq)](
        *args, FLOAT32_DOTS=q.dtype == torch.float32 or not q.is_cuda or interpreting(), BLOCK_M=block_m,
        BLOCK_N=block_n, num_warps=warps, num_stages=stages, **consts)
    return out
