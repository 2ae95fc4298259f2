"""Triton kernels of MLA over a paged *latent* cache: the store, and split-K decode in latent space.

The cache holds one row per token, ``[kv_c_normed (kv_lora_rank) | k_pe (rope)]``, shared by every
head (MLA is MQA in latent space). Decode works on *absorbed* queries (``MLAAttention`` folds
``W_UK`` into them): per head, ``q = [q_nope · W_UK (kv_lora_rank) | q_pe (rope)]``, so

    score(h, t) = q_lat[h] · latent[t] + q_pe[h] · k_pe[t]        (times the softmax scale)
    out_lat[h]  = sum_t softmax(score)[h, t] · latent[t]           (W_UV is applied afterwards)

The kernel follows :mod:`kernels_reference.ops.paged_decode` (read the cache once, online softmax in float32, splits of
a sequence divided on the device from its seq_len, partial outputs merged by that module's merge
kernel), with two MLA specifics:

* one program covers a block of 16 heads and reads each latent row once for all of them (16 heads
  are DeepSeek-V2-Lite's whole layer): the value rows *are* the latent rows already loaded for the
  scores, so a cache row is read from memory once per step;
* the row is split into its latent part (a power of two, 512) and its rope part (64), two tiles and
  two dots, instead of one 576-wide tile padded to 1024.

CUDA-graph contract as in :mod:`kernels_reference.ops.paged_decode`: launch shapes depend on tensor shapes only.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from ..paged_decode.config import LOG2E
from ..paged_decode.device import sm_count
from ..paged_decode.merge import merge_meta, run_merge, split_workspace

try:
    import triton
    import triton.language as tl
except ImportError:  # the native path still works without Triton
    triton = None

HEAD_BLOCK = 16  # heads per program (tl.dot's minimum tile side)


@dataclasses.dataclass(frozen=True)
class MLADecodeConfig:
    """Knobs of the latent decode (benchmarks/mla.py --sweep times them side by side on the H200)."""

    # Tokens per loop iteration: the [tokens, 512] latent tile and the [16, 512] float32 accumulator
    # are what a program holds; 32 tokens keep both in registers at 4 warps too. 4 warps were faster
    # than 8 in every sweep case on the H100 (2026-12-05: B1 C8192 33.4 vs 34.3 us, B32 C2048 51.6 vs
    # 59.3, B139 C1152 131.6 vs 165.7) and in both of the H200's (28.8 vs 29.7, 47.7 vs 56.9).
    tokens_per_iter: int = 32
    num_warps: int = 4
    num_stages: int = 2
    # Split until about this many programs per SM. Why 2: one program per (sequence, 16 heads) is
    # all a batch gives without splitting (B1: 1 program for 132 SMs); the kernel holds ~32 KiB of
    # latent tile + accumulator per program, so about 2 fit on an SM at once, and a second wave
    # would repeat the whole latency chain (seq_len -> block table -> cache rows).
    programs_per_sm: int = 2
    # Cap on splits: each split writes a [16, 512] float32 partial (32 KiB, as much as 28 cached
    # tokens), which the merge reads back from L2; 128 splits at B1 C8192 are 64 tokens each.
    max_splits: int = 128
    # A batch that fills the GPU alone is not split for filling, but a sequence as long as the block
    # table is wide would then run as one program while the others are short: on the H100
    # (2026-12-05) a 139-sequence step whose longest held 7680 tokens (mean 1940) took 609 us where
    # FlashInfer's balanced MLA decode took 168. So split until such a sequence's programs hold at
    # most this many tokens, while the batch stays under ``max_programs_per_sm`` programs per SM
    # (more splits add partial outputs for the merge to read back).
    long_tokens_per_program: int = 1024
    max_programs_per_sm: int = 8


MLA_DECODE_CONFIG = MLADecodeConfig()
# The launch before benchmarks/mla.py's sweep: 32 tokens per iteration, 8 warps, 2 stages and the
# paged-decode planner (4 programs per SM, at most 32 splits: B1 C8192 ran 32 programs on 132 SMs).
PREVIOUS_CONFIG = MLADecodeConfig(tokens_per_iter=32, num_warps=8, num_stages=2, programs_per_sm=4, max_splits=32)
MERGE_SPLITS_CHUNK = 16  # the merge reads [16 splits, 128 latent columns] float32 per step
MERGE_RANK_BLOCK = 128


def mla_num_splits(num_seqs: int, head_blocks: int, max_blocks: int, block_size: int, num_sms: int,
                   config: MLADecodeConfig = MLA_DECODE_CONFIG) -> int:
    """Splits per sequence, from shapes only (the CUDA-graph contract): at most ``programs_per_sm``
    programs per SM (rounded down: one wave, every program starts at once), or, where the block
    table is wide enough for one sequence to outlast the rest, enough splits for a full-width
    sequence's programs to hold ``long_tokens_per_program`` tokens (up to ``max_programs_per_sm``
    programs per SM); never more splits than a full-width block table has loop iterations, at most
    ``max_splits``, at least one."""
    programs = max(num_seqs * head_blocks, 1)
    iterations = max(-(-max_blocks * block_size // config.tokens_per_iter), 1)
    wanted = config.programs_per_sm * num_sms // programs
    long_sequence = -(-max_blocks * block_size // config.long_tokens_per_program)
    wanted = max(wanted, min(long_sequence, config.max_programs_per_sm * num_sms // programs))
    return max(1, min(wanted, iterations, config.max_splits))


def store_latent_triton(kv_c: torch.Tensor, k_pe: torch.Tensor, cache: torch.Tensor,
                        slot_mapping: torch.Tensor) -> None:
    """cache[slot] = [kv_c | k_pe] for every token with a slot >= 0 (negative: padding, skipped).
    kv_c [T, R] and k_pe [T, rope] (or [T, 1, rope]) may have strided rows; cache [blocks, bs, R + rope]."""
    if triton is None:
        raise RuntimeError("store_latent_triton needs Triton")
    tokens = slot_mapping.shape[0]
    kv_c = kv_c.reshape(kv_c.shape[0], -1)
    k_pe = k_pe.reshape(k_pe.shape[0], -1)
    rank, rope = kv_c.shape[1], k_pe.shape[1]
    if cache.dim() != 3 or cache.shape[2] != rank + rope or cache.stride(-1) != 1:
        raise ValueError(f"latent cache must be [blocks, block_size, {rank + rope}] with unit inner stride, "
                         f"got {tuple(cache.shape)}")
    if kv_c.shape[0] != tokens or k_pe.shape[0] != tokens:
        raise ValueError(f"{tokens} slots for {kv_c.shape[0]} latents and {k_pe.shape[0]} rope keys")
    if tokens == 0:
        return
    kv_c = kv_c if kv_c.stride(-1) == 1 else kv_c.contiguous()
    k_pe = k_pe if k_pe.stride(-1) == 1 else k_pe.contiguous()
    _store_latent_kernel[(tokens,)](
        kv_c, k_pe, cache, slot_mapping, kv_c.stride(0), k_pe.stride(0), cache.stride(0), cache.stride(1),
        cache.shape[1], RANK=rank, ROPE=rope, RANK_PAD=triton.next_power_of_2(rank),
        ROPE_PAD=triton.next_power_of_2(rope), num_warps=4)


def mla_decode(query: torch.Tensor, cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
               scale: float, kv_lora_rank: int, out: Optional[torch.Tensor] = None,
               num_splits: Optional[int] = None, q_pe: Optional[torch.Tensor] = None,
               config: Optional[MLADecodeConfig] = None) -> torch.Tensor:
    """Absorbed queries over the latent cache [blocks, bs, R + rope]; returns the latent outputs
    [B, H, R] (``out`` if given; any strides with a unit last one, e.g. a transposed [H, B, R]
    buffer that the W_UV GEMM then reads as it is).

    ``query`` is [B, H, R + rope], or with ``q_pe`` [B, H, rope] given, the latent part [B, H, R]
    alone (then neither is concatenated: the absorption GEMM's output is passed as it lands).
    ``seq_lens`` [B] int32 counts this step's token; a sequence of length 0 (a padded graph row)
    gives zeros. Two launches: the split decode, and (splits > 1) the merge."""
    if triton is None:
        raise RuntimeError("mla_decode needs Triton")
    config = config or MLA_DECODE_CONFIG
    rank = kv_lora_rank
    if q_pe is None:
        q_lat, q_pe = query[..., :rank], query[..., rank:]
    else:
        q_lat = query
    num_seqs, num_heads, _ = q_lat.shape
    rope = q_pe.shape[-1]
    _, block_size, cache_width = cache.shape
    if q_lat.shape[-1] != rank or cache_width != rank + rope or rope <= 0 or q_pe.shape[:2] != q_lat.shape[:2]:
        raise ValueError(f"queries of rank {q_lat.shape[-1]} + rope {rope} do not fit a latent cache of width "
                         f"{cache_width} (rank {rank})")
    q_lat = q_lat if q_lat.stride(-1) == 1 else q_lat.contiguous()
    q_pe = q_pe if q_pe.stride(-1) == 1 else q_pe.contiguous()
    if block_tables.stride(-1) != 1:
        block_tables = block_tables.contiguous()
    if out is None:
        out = torch.empty(num_seqs, num_heads, rank, dtype=q_lat.dtype, device=q_lat.device)
    if num_seqs == 0:
        return out
    tile = config.tokens_per_iter
    if tile % block_size and block_size % tile:
        raise ValueError(f"tokens per iteration {tile} and block size {block_size}: one must divide the other")
    blocks_per_iter = max(1, tile // block_size)
    if (blocks_per_iter * block_size) & (blocks_per_iter * block_size - 1) or blocks_per_iter * block_size < 16:
        raise ValueError(f"block_size {block_size}: tokens per iteration must be a power of two >= 16")
    head_blocks = triton.cdiv(num_heads, HEAD_BLOCK)
    splits = num_splits or mla_num_splits(num_seqs, head_blocks, block_tables.shape[1], block_size,
                                          sm_count(q_lat.device), config)
    rank_pad, rope_pad = triton.next_power_of_2(rank), max(16, triton.next_power_of_2(rope))
    part_out, part_lse = split_workspace(out, splits)
    _mla_decode_kernel[(num_seqs, head_blocks, splits)](
        q_lat, q_pe, cache, block_tables, seq_lens, out, part_out, part_lse, scale * LOG2E,
        q_lat.stride(0), q_lat.stride(1), q_pe.stride(0), q_pe.stride(1), cache.stride(0), cache.stride(1),
        block_tables.stride(0), out.stride(0), out.stride(1), num_heads,
        RANK=rank, ROPE=rope, RANK_PAD=rank_pad, ROPE_PAD=rope_pad, HEADS=HEAD_BLOCK,
        BLOCK_SIZE=block_size, BLOCKS_PER_ITER=blocks_per_iter, SPLIT=splits > 1,
        F32_DOT=q_lat.dtype == torch.float32 or not q_lat.is_cuda,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    if splits > 1:
        # (the interpreter pays per program, not per element: one column block off the GPU)
        rank_block = min(MERGE_RANK_BLOCK, rank_pad) if q_lat.is_cuda else rank_pad
        # (sequence, head, latent column block): B1 with 16 heads is 64 programs, each reading its
        # splits' columns in chunks with a running max (a whole [splits, 512] tile would spill).
        # The paged decode's merge kernel (same [seq, head, split] partial rows), the latent rank
        # as its head size.
        run_merge(part_out, part_lse, out, splits, *merge_meta(splits, rank, rank_block, MERGE_SPLITS_CHUNK, False))
    return out


def mla_decode_bytes(seq_lens, num_heads: int, rank: int, rope: int, element_size: int) -> int:
    """Fewest bytes of one decode step of the kernel: each cached latent row once, queries, outputs."""
    rows = sum(int(n) for n in seq_lens)
    return (rows * (rank + rope) + len(seq_lens) * num_heads * (2 * rank + rope)) * element_size


if triton is not None:

    @triton.jit
    def _store_latent_kernel(kv_c_ptr, k_pe_ptr, cache_ptr, slot_ptr, c_s_tok, pe_s_tok, s_block, s_tok,
                             block_size, RANK: tl.constexpr, ROPE: tl.constexpr, RANK_PAD: tl.constexpr,
                             ROPE_PAD: tl.constexpr):
        token = tl.program_id(0).to(tl.int64)
        slot = tl.load(slot_ptr + token).to(tl.int64)
        row = cache_ptr + (slot // block_size) * s_block + (slot % block_size) * s_tok
        r = tl.arange(0, RANK_PAD)
        p = tl.arange(0, ROPE_PAD)
        # (the slot test broadcast to a tile: Triton's interpreter rejects a scalar inside a mask)
        r_mask = (r < RANK) & (r * 0 + slot >= 0)
        p_mask = (p < ROPE) & (p * 0 + slot >= 0)
        latent = tl.load(kv_c_ptr + token * c_s_tok + r, mask=r_mask)
        tl.store(row + r, latent.to(cache_ptr.dtype.element_ty), mask=r_mask)
        pe = tl.load(k_pe_ptr + token * pe_s_tok + p, mask=p_mask)
        tl.store(row + RANK + p, pe.to(cache_ptr.dtype.element_ty), mask=p_mask)

    @triton.jit
    def _mla_decode_kernel(
        q_ptr, q_pe_ptr, cache_ptr, block_tables_ptr, seq_lens_ptr, out_ptr, part_out_ptr, part_lse_ptr,
        scale_log2, q_s_seq, q_s_head, qpe_s_seq, qpe_s_head, c_s_block, c_s_tok, bt_s_seq, o_s_seq, o_s_head,
        num_heads,
        RANK: tl.constexpr, ROPE: tl.constexpr, RANK_PAD: tl.constexpr, ROPE_PAD: tl.constexpr,
        HEADS: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCKS_PER_ITER: tl.constexpr, SPLIT: tl.constexpr,
        F32_DOT: tl.constexpr,
    ):
        seq = tl.program_id(0).to(tl.int64)
        head_block = tl.program_id(1)
        split = tl.program_id(2)
        num_splits = tl.num_programs(2)
        TILE: tl.constexpr = BLOCKS_PER_ITER * BLOCK_SIZE

        seq_len = tl.load(seq_lens_ptr + seq)
        num_blocks = tl.cdiv(seq_len, BLOCK_SIZE)
        per_split = tl.cdiv(tl.cdiv(num_blocks, num_splits), BLOCKS_PER_ITER) * BLOCKS_PER_ITER
        block_start = split * per_split
        block_end = tl.minimum(block_start + per_split, num_blocks)

        h = head_block * HEADS + tl.arange(0, HEADS)
        r = tl.arange(0, RANK_PAD)
        p = tl.arange(0, ROPE_PAD)
        h_mask = h < num_heads
        q_lat = tl.load(q_ptr + seq * q_s_seq + h[:, None] * q_s_head + r[None, :],
                        mask=h_mask[:, None] & (r < RANK)[None, :], other=0.0)
        q_pe = tl.load(q_pe_ptr + seq * qpe_s_seq + h[:, None] * qpe_s_head + p[None, :],
                       mask=h_mask[:, None] & (p < ROPE)[None, :], other=0.0)
        if F32_DOT:
            q_lat = q_lat.to(tl.float32)
            q_pe = q_pe.to(tl.float32)

        t = tl.arange(0, TILE)
        block_of_token = t // BLOCK_SIZE
        offset_in_block = t % BLOCK_SIZE
        table = block_tables_ptr + seq * bt_s_seq
        physical = tl.load(table + block_start + block_of_token,
                           mask=block_start * BLOCK_SIZE + t < seq_len, other=0)
        m = tl.full([HEADS], float("-inf"), tl.float32)
        l = tl.zeros([HEADS], tl.float32)
        acc = tl.zeros([HEADS, RANK_PAD], tl.float32)
        for block in range(block_start, block_end, BLOCKS_PER_ITER):
            valid = block * BLOCK_SIZE + t < seq_len
            rows = cache_ptr + physical.to(tl.int64)[:, None] * c_s_block + offset_in_block[:, None] * c_s_tok
            latent = tl.load(rows + r[None, :], mask=valid[:, None] & (r < RANK)[None, :], other=0.0)
            pe = tl.load(rows + RANK + p[None, :], mask=valid[:, None] & (p < ROPE)[None, :], other=0.0)
            next_block = block + BLOCKS_PER_ITER
            physical = tl.load(table + next_block + block_of_token,
                               mask=next_block * BLOCK_SIZE + t < tl.minimum(seq_len, block_end * BLOCK_SIZE),
                               other=0)
            if F32_DOT:
                latent = latent.to(tl.float32)
                s = tl.dot(q_lat, tl.trans(latent), input_precision="ieee")
                s += tl.dot(q_pe, tl.trans(pe.to(tl.float32)), input_precision="ieee")
            else:
                s = tl.dot(q_lat, tl.trans(latent))
                s += tl.dot(q_pe, tl.trans(pe))
            s = tl.where(valid[None, :], s * scale_log2, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=1))
            alpha = tl.exp2(m - m_new)
            probs = tl.exp2(s - m_new[:, None])
            l = l * alpha + tl.sum(probs, axis=1)
            # P @ latent takes p at the cache's precision, as on tensor cores
            p_low = probs.to(cache_ptr.dtype.element_ty)
            if F32_DOT:
                pv = tl.dot(p_low.to(tl.float32), latent, input_precision="ieee")
            else:
                pv = tl.dot(p_low, latent)
            acc = acc * alpha[:, None] + pv
            m = m_new

        has_work = l > 0.0
        result = acc / tl.where(has_work, l, 1.0)[:, None]
        out_mask = h_mask[:, None] & (r < RANK)[None, :]
        if SPLIT:
            row = (seq * num_heads + h) * num_splits + split
            tl.store(part_out_ptr + row[:, None] * RANK + r[None, :], result, mask=out_mask)
            lse = tl.where(has_work, m + tl.log2(tl.where(has_work, l, 1.0)), float("-inf"))
            tl.store(part_lse_ptr + row, lse, mask=h_mask)
        else:
            tl.store(out_ptr + seq * o_s_seq + h[:, None] * o_s_head + r[None, :],
                     result.to(out_ptr.dtype.element_ty), mask=out_mask)

