"""Paged decode that reads whole cache blocks: ``DecodeConfig(kernel="blocks")``.

Why a third kernel. At batch 1 the split kernels of :mod:`.paged_decode` give each program one kv
head, so a program reads 256-byte rows (one head's K or V of one token) at the cache's token stride
(num_kv_heads x head_size elements). On the H200, reading the bytes of B1 C8192 that way reached
0.32-0.48 of copy bandwidth however the work was cut (one cache block, 32, 64 or 128 tokens per
program, with or without staging through shared memory), while reading whole blocks through the
same table (every kv head of 16 tokens: 32 KiB contiguous per block) reached 0.63 (one block per
program) and 0.70 (two): docs/perf/h200-decode-b1.md, runs 10-11.

Measured (docs/perf/h200-decode-b1.md, run 12): it lost. B1 C8192 18.7 us at best against 15.2
for the two-pass kernel with early metadata, and it lost at every other case too. An sm_90 compile
shows why it may: 216 registers per thread at 4 warps (2 programs per SM), 188 at 8 (1 per SM),
for the block-diagonal dots that compute num_kv_heads times the useful products. It stays
selectable (``DecodeConfig(kernel="blocks")``, not a default) for the next attempt, which needs
far fewer registers per byte read: per-kv-head dots, or the scores on the CUDA cores.

So here a program owns whole cache blocks of one sequence and computes every query head from
them. The tile is [tokens x kv heads, head_size] (rows in the cache's own order, token-major), the
queries are [query heads, head_size], and one dot gives every head's scores against every row; a
row counts for a query head only when it belongs to the head's kv head (a block-diagonal mask). The
tensor cores do num_kv_heads times the useful work for it (a decode step has little), which is why
``paged_decode`` runs this kernel only where it asks for it.

Split-KV as in the two-pass kernel: split s owns blocks [s x P, (s + 1) x P) of the table, P a
function of shapes (so is the grid: the CUDA-graph contract of :mod:`.paged_decode` holds), reads
them STEP blocks per loop step, and writes a partial (output and log-sum-exp per query head) that
the merge kernel of :mod:`.paged_decode` combines. The PDL modes are those of the two-pass kernel.
"""
from __future__ import annotations

import torch

from . import paged_decode as pd
from .paged_decode import _gdc_launch_dependents, _gdc_wait, triton

if triton is not None:
    import triton.language as tl

    from .paged_decode import attend_tile


def blocks_num_splits(num_seqs: int, max_blocks: int, num_sms: int, config) -> tuple:
    """(splits per sequence, blocks per split), from shapes only: about ``small_batch_programs_per_sm``
    (or, once the sequences alone fill the SMs, ``programs_per_sm``) programs per SM, each split a
    whole number of loop steps of ``blocks_per_iter`` blocks, no split without table entries."""
    per_sm = config.small_batch_programs_per_sm if num_seqs < num_sms else config.programs_per_sm
    wanted = max(1, min(-(-per_sm * num_sms // max(num_seqs, 1)), config.max_splits))
    step = config.blocks_per_iter
    per_split = -(-max(max_blocks, 1) // wanted)
    per_split = -(-per_split // step) * step
    return -(-max(max_blocks, 1) // per_split), per_split


def launch_blocks(query, key_cache, value_cache, block_tables, seq_lens, scale, out, config, num_splits):
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    width = block_tables.shape[1]
    splits, per_split = blocks_num_splits(num_seqs, width, pd.sm_count(query.device), config)
    if num_splits:  # forced (tests): that many splits, blocks shared out in whole steps
        per_split = -(-(-(-max(width, 1) // num_splits)) // config.blocks_per_iter) * config.blocks_per_iter
        splits = num_splits
    kv_pad = triton.next_power_of_2(num_kv_heads)
    rows = config.blocks_per_iter * block_size * kv_pad
    if rows < 16:
        raise ValueError(f"kernel 'blocks': blocks_per_iter x block_size x kv heads must be >= 16, got {rows}")
    if splits > 1:
        part_out = torch.empty(num_seqs, num_heads, splits, head_dim, dtype=torch.float32, device=query.device)
        part_lse = torch.empty(num_seqs, num_heads, splits, dtype=torch.float32, device=query.device)
    else:
        part_out = part_lse = out
    gdc = config.pdl != "off" and query.is_cuda
    split_pdl = gdc and config.pdl in ("all", "early-metadata")
    _decode_blocks_kernel[(num_seqs, splits)](
        query, key_cache, value_cache, block_tables, seq_lens, out, part_out, part_lse,
        scale * pd.LOG2E, per_split,
        query.stride(0), query.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1), width,
        NUM_HEADS=num_heads, HEADS_PAD=max(16, triton.next_power_of_2(num_heads)), GROUP=num_heads // num_kv_heads,
        NUM_KV=num_kv_heads, KV_PAD=kv_pad, HEAD_DIM=head_dim, DIM_PAD=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_SIZE=block_size, STEP_BLOCKS=config.blocks_per_iter, SPLIT=splits > 1, F32_DOT=pd._f32_dot(query),
        EARLY_METADATA=config.pdl == "early-metadata", PDL_WAIT=split_pdl, PDL_TRIGGER=gdc and splits > 1,
        num_warps=config.num_warps, num_stages=config.num_stages, **pd._launch_options(split_pdl),
    )
    if splits > 1:
        dim_pad = max(16, triton.next_power_of_2(head_dim))
        chunks, meta = pd.merge_launch(splits, head_dim, dim_pad, config.merge_programs_per_head, gdc)
        pd._merge_splits_kernel[(num_seqs, num_heads, chunks)](
            part_out, part_lse, out, out.stride(0), out.stride(1), splits, **meta,
            num_warps=4, **pd._launch_options(gdc))


if triton is not None:

    @triton.jit
    def _decode_blocks_kernel(
        q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, out_ptr, part_out_ptr, part_lse_ptr,
        scale_log2, per_split,
        q_s_seq, q_s_head,
        k_s_block, k_s_tok, k_s_head,
        v_s_block, v_s_tok, v_s_head,
        bt_s_seq, o_s_seq, o_s_head, table_width,
        NUM_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr, GROUP: tl.constexpr, NUM_KV: tl.constexpr,
        KV_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
        STEP_BLOCKS: tl.constexpr, SPLIT: tl.constexpr, F32_DOT: tl.constexpr,
        EARLY_METADATA: tl.constexpr, PDL_WAIT: tl.constexpr, PDL_TRIGGER: tl.constexpr,
    ):
        seq = tl.program_id(0).to(tl.int64)
        split = tl.program_id(1)
        num_splits = tl.num_programs(1)
        ROWS: tl.constexpr = STEP_BLOCKS * BLOCK_SIZE * KV_PAD
        if PDL_TRIGGER:
            _gdc_launch_dependents()  # the merge kernel's programs may become resident now
        if PDL_WAIT and not EARLY_METADATA:
            _gdc_wait()  # nothing is read before the previous kernel's writes are visible

        # Tile row r: token r // KV_PAD of the step (block-major, as the cache stores them), kv head
        # r % KV_PAD; a step's rows of one block are BLOCK_SIZE x num_kv_heads x head_size contiguous.
        r = tl.arange(0, ROWS)
        token = r // KV_PAD
        kv = r % KV_PAD
        block_of_row = token // BLOCK_SIZE
        table = block_tables_ptr + seq * bt_s_seq
        first = split * per_split
        seq_len = tl.load(seq_lens_ptr + seq)
        # The first step's table entries depend on shapes only (not on seq_len): requested together
        # with seq_len. Entries past the sequence are read but never dereferenced.
        physical = tl.load(table + first + block_of_row, mask=first + block_of_row < table_width, other=0)
        if EARLY_METADATA:
            if PDL_WAIT:
                _gdc_wait()
        end = tl.minimum(first + per_split, tl.cdiv(seq_len, BLOCK_SIZE))

        h = tl.arange(0, HEADS_PAD)
        d = tl.arange(0, DIM_PAD)
        d_mask = (d < HEAD_DIM)[None, :]
        head_mask = (h < NUM_HEADS)[:, None] & d_mask
        q = tl.load(q_ptr + seq * q_s_seq + h[:, None] * q_s_head + d[None, :], mask=head_mask, other=0.0)
        # Query head h reads only its kv head's rows (padding heads read every row: no all -inf row)
        own_row = ((h // GROUP)[:, None] == kv[None, :]) | (h >= NUM_HEADS)[:, None]

        m = tl.full([HEADS_PAD], float("-inf"), tl.float32)  # running max, in log2 units
        l = tl.zeros([HEADS_PAD], tl.float32)
        acc = tl.zeros([HEADS_PAD, DIM_PAD], tl.float32)
        for block in range(first, end, STEP_BLOCKS):
            valid = (block * BLOCK_SIZE + token < seq_len) & (kv < NUM_KV)
            rows = physical.to(tl.int64)[:, None]
            in_block = (token % BLOCK_SIZE)[:, None]
            kv_mask = valid[:, None] & d_mask
            k = tl.load(k_cache_ptr + rows * k_s_block + in_block * k_s_tok + kv[:, None] * k_s_head + d[None, :],
                        mask=kv_mask, other=0.0)
            v = tl.load(v_cache_ptr + rows * v_s_block + in_block * v_s_tok + kv[:, None] * v_s_head + d[None, :],
                        mask=kv_mask, other=0.0)
            nxt = block + STEP_BLOCKS  # the next step's table entries, requested before this step's math
            physical = tl.load(table + nxt + block_of_row, mask=nxt + block_of_row < end, other=0)
            m, l, acc = attend_tile(q, k, v, own_row & valid[None, :], m, l, acc, scale_log2, F32_DOT)

        has_work = l > 0.0  # false for a split past the sequence's end and for a padded row
        result = acc / tl.where(has_work, l, 1.0)[:, None]
        if SPLIT:
            row = (seq * NUM_HEADS + h) * num_splits + split  # the merge kernel's [seq, head, split] rows
            tl.store(part_out_ptr + row[:, None] * HEAD_DIM + d[None, :], result, mask=head_mask)
            lse = tl.where(has_work, m + tl.log2(tl.where(has_work, l, 1.0)), float("-inf"))
            tl.store(part_lse_ptr + row, lse, mask=h < NUM_HEADS)
        else:
            tl.store(out_ptr + seq * o_s_seq + h[:, None] * o_s_head + d[None, :],
                     result.to(out_ptr.dtype.element_ty), mask=head_mask)
