"""Paged decode that reads whole cache blocks: ``DecodeConfig(kernel="blocks")``.

Why a third kernel. At batch 1 the split kernels of :mod:`.two_pass` give each program one kv
head, so a program reads 256-byte rows (one head's K or V of one token) at the cache's token stride
(num_kv_heads x head_size elements). On the H200, reading the bytes of B1 C8192 that way reached
0.32-0.48 of copy bandwidth however the work was cut (one cache block, 32, 64 or 128 tokens per
program, with or without staging through shared memory), while reading whole blocks through the
same table (every kv head of 16 tokens: 32 KiB contiguous per block) reached 0.63 (one block per
program) and 0.70 (two): docs/perf/h200-decode-b1.md, runs 10-11.

So here a program owns whole cache blocks of one sequence and computes every query head from
them. K and V are loaded as [kv heads, tokens, head_size] and the math is a batched dot per step
with the kv heads as the batch. The query tile is [kv heads, group, head_size], the group padded to
the 16 rows a dot needs.

Measured on the H200 (docs/perf/h200-decode-b1.md, runs 12-18). Its best form is ``BLOCKS_CONFIG``
(8 warps, one block per step, pipelined 3 deep through shared memory, about one program per SM, 128
splits of 4 steps at B1 C8192) with early-metadata PDL:
- B1 C8192: 14.3-14.5 us, level with the two-pass kernel with the same PDL (13.9-14.3). Not the
  0.70 of copy that issue 12 asks for.
- B1 C32768: 36.9-37.3 us (0.85-0.86 of copy), a little faster than the two-pass kernel (37.7-38.1).
- B1 C2048: 8.1-8.3 us against 9.3.
- Batch 32-128: slower than the default (B32 C2048 85 against 67 us, B128 C1024 148 against 127).
Unpipelined it is 1.5x slower. Loaded token-major and permuted, it was 1.3-1.4x slower. With fewer
than all kv heads per program it was 1.25-6x slower (run 16, reverted). An earlier block-diagonal
form of the math (one dot of every query head against every row; commit c18dad7) took 18.7-19.7 us.
It stays selectable (``DecodeConfig(kernel="blocks")``; not a default: it wins only at batch 1,
by a little, and the engine's decode was not measured with it).

``kv_loads="tma"`` (2026-12-01, commits acf7a40..5f2d7ae, run 20) copies each block of K and of V into shared memory with one
Hopper bulk copy, head-major through a permuted-stride tensor descriptor. It reads no faster than
Triton's loads (0.63 of copy read-only, against 0.71) and decodes B1 C8192 level with them (14.7 us
against 14.4); it is the fastest measured at B1 C32768 (35.9 us, 0.88) and beats the pointer form at
B32 C2048 (79.7 against 85.2, still behind the default's 66.5). Selectable, not a default.

Split-KV as in the two-pass kernel: split s owns blocks [s x P, (s + 1) x P) of the table, P a
function of shapes (so is the grid: the CUDA-graph contract of :mod:`kernels_reference.ops.paged_decode` holds), reads
them STEP blocks per loop step, and writes a partial (output and log-sum-exp per query head) that
the merge kernel of :mod:`.merge` combines. The PDL modes are those of the two-pass kernel.
"""
from __future__ import annotations

import torch

from .config import LOG2E
from .device import VariantUnavailable, _f32_dot, _launch_options, sm_count, triton
from .merge import merge_launch, run_merge, split_workspace

if triton is not None:
    import triton.language as tl

    from .two_pass import _metadata_read, _split_start, attend_tile


def blocks_num_splits(num_seqs: int, max_blocks: int, num_sms: int, config) -> tuple:
    """(splits per sequence, blocks per split), from shapes only: about ``small_batch_programs_per_sm``
    (or, once the sequences alone fill the SMs, ``programs_per_sm``) programs per SM, each split a
    whole number of loop steps of ``blocks_per_iter`` blocks, no split without table entries."""
    per_sm = config.small_batch_programs_per_sm if num_seqs < num_sms else config.programs_per_sm
    wanted = max(1, min(-(-per_sm * num_sms // max(num_seqs, 1)), config.max_splits))
    per_split = _blocks_per_split(max_blocks, wanted, config.blocks_per_iter)
    return -(-max(max_blocks, 1) // per_split), per_split


def _blocks_per_split(max_blocks: int, splits: int, step: int) -> int:
    """The table's blocks shared out over ``splits``, rounded up to whole loop steps."""
    return -(-(-(-max(max_blocks, 1) // splits)) // step) * step


def tma_unavailable_reason(device: torch.device):
    """None when ``kv_loads="tma"`` can run on ``device``; else why not. The interpreter runs the
    descriptor loads as plain gathers (the tests' path); on a GPU, TMA needs sm_90+ and a Triton
    with host-side tensor descriptors."""
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means the same: no descriptors
        return f"triton {triton.__version__} has no host-side tensor descriptors"
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if major < 9:
            return f"TMA needs sm_90 or newer, {torch.cuda.get_device_name(device)} is sm_{major}{minor}"
    return None


def _tma_descriptors(key_cache, value_cache, config):
    """One descriptor per cache over [blocks, kv heads, tokens, head_size], a permuted view of the
    cache's [blocks, tokens, kv heads, head_size] (a tensor map takes any 16-byte-aligned strides), so
    one bulk copy brings a whole block into shared memory head-major, the order the batched dot reads."""
    reason = tma_unavailable_reason(key_cache.device)
    if reason:
        raise VariantUnavailable(f"DecodeConfig(kv_loads='tma'): {reason}")
    from triton.tools.tensor_descriptor import TensorDescriptor
    num_blocks, block_size, num_kv, head_dim = key_cache.shape
    caches = (key_cache, value_cache)
    problems = [f"{name} {n} is not a power of two" for name, n in
                (("num_kv_heads", num_kv), ("head_size", head_dim), ("block_size", block_size)) if n & (n - 1)]
    if config.blocks_per_iter != 1:
        problems.append(f"blocks_per_iter is {config.blocks_per_iter}, TMA loads one block per step")
    problems += [f"a cache's base or strides {tuple(c.stride())} are not 16-byte aligned" for c in caches
                 if c.data_ptr() % 16 or any(st * c.element_size() % 16 for st in c.stride()[:3])]
    if problems:
        raise ValueError("kv_loads='tma': " + "; ".join(problems))
    return [TensorDescriptor(c, [num_blocks, num_kv, block_size, head_dim], [c.stride(0), c.stride(2), c.stride(1), 1],
                             [1, num_kv, block_size, head_dim]) for c in caches]


def launch_blocks(query, key_cache, value_cache, block_tables, seq_lens, scale, out, config, num_splits):
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    tma = config.kv_loads == "tma"
    k_desc, v_desc = _tma_descriptors(key_cache, value_cache, config) if tma else (None, None)
    width = block_tables.shape[1]
    splits, per_split = blocks_num_splits(num_seqs, width, sm_count(query.device), config)
    if num_splits:  # forced (tests): that many splits, blocks shared out in whole steps
        per_split = _blocks_per_split(width, num_splits, config.blocks_per_iter)
        splits = num_splits
    kv_pad = triton.next_power_of_2(num_kv_heads)  # the dot's batch: any power of two
    part_out, part_lse = split_workspace(out, splits)
    gdc = config.pdl != "off" and query.is_cuda
    split_pdl = gdc and config.pdl in ("all", "early-metadata")
    _decode_blocks_kernel[(num_seqs, splits)](
        query, key_cache, value_cache, k_desc, v_desc, block_tables, seq_lens, out, part_out, part_lse,
        scale * LOG2E, per_split,
        query.stride(0), query.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1), width,
        NUM_HEADS=num_heads, GROUP=num_heads // num_kv_heads,
        GROUP_PAD=max(16, triton.next_power_of_2(num_heads // num_kv_heads)),
        NUM_KV=num_kv_heads, KV_PAD=kv_pad, HEAD_DIM=head_dim, DIM_PAD=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_SIZE=block_size, STEP_BLOCKS=config.blocks_per_iter, SPLIT=splits > 1, F32_DOT=_f32_dot(query),
        EARLY_METADATA=config.pdl == "early-metadata", PDL_WAIT=split_pdl, PDL_TRIGGER=gdc and splits > 1, TMA=tma,
        num_warps=config.num_warps, num_stages=config.num_stages, **_launch_options(split_pdl),
    )
    if splits > 1:
        dim_pad = max(16, triton.next_power_of_2(head_dim))
        run_merge(part_out, part_lse, out, splits,
                  *merge_launch(splits, head_dim, dim_pad, config.merge_programs_per_head, gdc))


if triton is not None:

    @triton.jit
    def _tma_block(k_desc, v_desc, phys, KV_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, DIM_PAD: tl.constexpr):
        """Cache block ``phys`` of K and of V, one bulk copy each, as [kv heads, tokens, head_size]."""
        k = k_desc.load([phys, 0, 0, 0]).reshape(KV_PAD, BLOCK_SIZE, DIM_PAD)
        v = v_desc.load([phys, 0, 0, 0]).reshape(KV_PAD, BLOCK_SIZE, DIM_PAD)
        return k, v

    @triton.jit
    def _decode_blocks_kernel(
        q_ptr, k_cache_ptr, v_cache_ptr, k_desc, v_desc, block_tables_ptr, seq_lens_ptr, out_ptr, part_out_ptr,
        part_lse_ptr,
        scale_log2, per_split,
        q_s_seq, q_s_head,
        k_s_block, k_s_tok, k_s_head,
        v_s_block, v_s_tok, v_s_head,
        bt_s_seq, o_s_seq, o_s_head, table_width,
        NUM_HEADS: tl.constexpr, GROUP_PAD: tl.constexpr, GROUP: tl.constexpr, NUM_KV: tl.constexpr,
        KV_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
        STEP_BLOCKS: tl.constexpr, SPLIT: tl.constexpr, F32_DOT: tl.constexpr,
        EARLY_METADATA: tl.constexpr, PDL_WAIT: tl.constexpr, PDL_TRIGGER: tl.constexpr, TMA: tl.constexpr,
    ):
        """Split ``split`` of sequence ``seq``: blocks [split x per_split, + per_split) of its
        table, STEP_BLOCKS whole blocks per step; the math one batched dot per step with the kv
        heads as the batch ([kv heads, group, head_size] queries against [kv heads, tokens,
        head_size] K/V)."""
        seq = tl.program_id(0).to(tl.int64)
        split = tl.program_id(1)
        num_splits = tl.num_programs(1)
        TOK: tl.constexpr = STEP_BLOCKS * BLOCK_SIZE
        _split_start(PDL_TRIGGER, PDL_WAIT, EARLY_METADATA)
        t = tl.arange(0, TOK)
        block_of_token = t // BLOCK_SIZE
        table = block_tables_ptr + seq * bt_s_seq
        first = split * per_split
        seq_len = tl.load(seq_lens_ptr + seq)
        physical = tl.load(table + first + block_of_token, mask=first + block_of_token < table_width, other=0)
        _metadata_read(PDL_WAIT, EARLY_METADATA)
        end = tl.minimum(first + per_split, tl.cdiv(seq_len, BLOCK_SIZE))

        kv = tl.arange(0, KV_PAD)
        g = tl.arange(0, GROUP_PAD)
        d = tl.arange(0, DIM_PAD)
        head = kv[:, None] * GROUP + g[None, :]  # [kv heads, group]
        head_ok = (kv < NUM_KV)[:, None] & (g < GROUP)[None, :]
        q_mask = head_ok[:, :, None] & (d < HEAD_DIM)[None, None, :]
        q = tl.load(q_ptr + seq * q_s_seq + head[:, :, None] * q_s_head + d[None, None, :], mask=q_mask, other=0.0)
        # K/V loaded head-major, [kv heads, tokens, head_size]: a warp's load covers one kv head's
        # rows of two tokens, the program's loads the whole block. Loaded token-major (the cache's
        # order) and permuted instead, the kernel was 1.3-1.4x slower once pipelined (runs 17-18).
        kv_ok = (kv < NUM_KV)[:, None, None] & (d < HEAD_DIM)[None, None, :]
        tok_in_block = (t % BLOCK_SIZE)[None, :, None]
        m = tl.full([KV_PAD, GROUP_PAD], float("-inf"), tl.float32)
        l = tl.zeros([KV_PAD, GROUP_PAD], tl.float32)
        acc = tl.zeros([KV_PAD, GROUP_PAD, DIM_PAD], tl.float32)
        if TMA:
            # Full blocks by bulk copies, unmasked; a last, partial block apart (the cache past
            # seq_len may hold anything, NaN included: its V rows are zeroed, its scores masked).
            full_end = tl.maximum(first, tl.minimum(end, seq_len // BLOCK_SIZE))  # past end: no partial block here
            # The next table entry is read one step ahead (a loop-carried value, as in the pointer
            # loop): a copy whose coordinates come from a load of the same step is pipelined only
            # one block deep by Triton (3.9, sm_90: one K/V buffer), carried it gets num_stages - 1.
            phys = tl.load(table + first, mask=first < full_end, other=0)
            for block in range(first, full_end):
                k, v = _tma_block(k_desc, v_desc, phys, KV_PAD, BLOCK_SIZE, DIM_PAD)
                phys = tl.load(table + block + 1, mask=block + 1 < full_end, other=0)
                m, l, acc = attend_tile(q, tl.permute(k, (0, 2, 1)), v, (t >= 0)[None, None, :], m, l, acc,
                                        scale_log2, F32_DOT)
            if full_end < end:
                phys = tl.load(table + full_end)
                valid = full_end * BLOCK_SIZE + t < seq_len
                k, v = _tma_block(k_desc, v_desc, phys, KV_PAD, BLOCK_SIZE, DIM_PAD)
                v = tl.where(valid[None, :, None], v, tl.zeros_like(v))
                m, l, acc = attend_tile(q, tl.permute(k, (0, 2, 1)), v, valid[None, None, :], m, l, acc,
                                        scale_log2, F32_DOT)
        else:
            for block in range(first, end, STEP_BLOCKS):
                valid = block * BLOCK_SIZE + t < seq_len
                rows = physical.to(tl.int64)[None, :, None]
                mask = valid[None, :, None] & kv_ok
                k = tl.load(k_cache_ptr + rows * k_s_block + tok_in_block * k_s_tok + kv[:, None, None] * k_s_head
                            + d[None, None, :], mask=mask, other=0.0)
                v = tl.load(v_cache_ptr + rows * v_s_block + tok_in_block * v_s_tok + kv[:, None, None] * v_s_head
                            + d[None, None, :], mask=mask, other=0.0)
                nxt = block + STEP_BLOCKS
                physical = tl.load(table + nxt + block_of_token, mask=nxt + block_of_token < end, other=0)
                m, l, acc = attend_tile(q, tl.permute(k, (0, 2, 1)), v, valid[None, None, :], m, l, acc, scale_log2,
                                        F32_DOT)

        has_work = l > 0.0
        result = acc / tl.where(has_work, l, 1.0)[:, :, None]
        if SPLIT:
            row = (seq * NUM_HEADS + head) * num_splits + split
            tl.store(part_out_ptr + row[:, :, None] * HEAD_DIM + d[None, None, :], result, mask=q_mask)
            lse = tl.where(has_work, m + tl.log2(tl.where(has_work, l, 1.0)), float("-inf"))
            tl.store(part_lse_ptr + row, lse, mask=head_ok)
        else:
            tl.store(out_ptr + seq * o_s_seq + head[:, :, None] * o_s_head + d[None, None, :],
                     result.to(out_ptr.dtype.element_ty), mask=q_mask)
