"""The one-pass split-K decode kernel (``ONE_PASS_CONFIG``, selectable, not the default): interleaved
tiles per split, the last split to finish merges in the same launch; at a small batch as many
programs as are resident at once (from the compiled kernel's footprint).
"""
from __future__ import annotations

import torch

from ...triton_rows import cached_resident_programs
from .config import DECODE_CONFIG, LOG2E, DecodeConfig, decode_num_splits
from .device import _f32_dot, sm_count, triton
from .merge import _merge_chunk, _split_counters

if triton is not None:
    import triton.language as tl

    from .merge import _merge_group
    from .two_pass import attend_tile


def _launch_one_pass(query, key_cache, value_cache, block_tables, seq_lens, scale, out, config, num_splits):
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    group = num_heads // num_kv_heads
    group_pow2 = triton.next_power_of_2(group)
    dim_pad = max(16, triton.next_power_of_2(head_dim))
    merge_chunk = _merge_chunk(group, dim_pad, config.num_warps)

    def launch(grid, split, part_out, part_lse, counters, warmup=False):
        args = (query, key_cache, value_cache, block_tables, seq_lens, out, part_out, part_lse, counters,
                scale * LOG2E,
                query.stride(0), query.stride(1),
                key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
                value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
                block_tables.stride(0), out.stride(0), out.stride(1))
        # tl.dot wants every tile dimension >= 16; padded query rows are computed and dropped.
        meta = dict(GROUP=group, GROUP_PAD=max(16, group_pow2), GROUP_POW2=group_pow2, HEAD_DIM=head_dim,
                    DIM_PAD=dim_pad, BLOCK_SIZE=block_size, BLOCKS_PER_ITER=config.blocks_per_iter, SPLIT=split,
                    MERGE_CHUNK=merge_chunk, F32_DOT=_f32_dot(query),
                    num_warps=config.num_warps, num_stages=config.num_stages)
        if warmup:
            return _decode_one_pass_kernel.warmup(*args, grid=grid, **meta)
        return _decode_one_pass_kernel[grid](*args, **meta)

    splits = num_splits or one_pass_plan(query, key_cache, block_tables, config,
                                         lambda: launch((1, 1, 1), True, out, out, seq_lens, warmup=True))["splits"]
    if splits > 1:
        rows = num_seqs * num_kv_heads * splits * group  # [seq, kv head, split, group] rows
        part_out = torch.empty(rows, head_dim, dtype=torch.float32, device=query.device)
        part_lse = torch.empty(rows, dtype=torch.float32, device=query.device)
        counters = _split_counters(query.device, num_seqs * num_kv_heads)
    else:  # one split writes the final output directly; the workspace pointers are unused
        part_out = part_lse = out
        counters = seq_lens
    launch((num_seqs, num_kv_heads, splits), splits > 1, part_out, part_lse, counters)


def one_pass_plan(query: torch.Tensor, key_cache: torch.Tensor, block_tables: torch.Tensor,
                  config: DecodeConfig = DECODE_CONFIG, compile_split_kernel=None) -> dict:
    """The one-pass launch for these shapes: ``splits`` per sequence and ``resident_per_sm``
    (programs of the split kernel that fit on one SM at once; None off the GPU or before the
    kernel was compiled when ``compile_split_kernel`` is not given)."""
    num_seqs, _, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    resident = None
    if query.is_cuda and num_seqs * num_kv_heads < sm_count(query.device):
        key = ("paged_decode_one_pass", query.dtype, key_cache.dtype, query.shape[1] // num_kv_heads,
               head_dim, block_size, config)
        resident = cached_resident_programs(key, compile_split_kernel, query.device)
    splits = decode_num_splits(num_seqs, num_kv_heads, block_tables.shape[1], sm_count(query.device), config,
                               resident)
    return {"splits": splits, "resident_per_sm": resident}


if triton is not None:

    @triton.jit
    def _decode_one_pass_kernel(
        q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, out_ptr, part_out_ptr, part_lse_ptr,
        counters_ptr, scale_log2,
        q_s_seq, q_s_head,
        k_s_block, k_s_tok, k_s_head,
        v_s_block, v_s_tok, v_s_head,
        bt_s_seq, o_s_seq, o_s_head,
        GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, GROUP_POW2: tl.constexpr, HEAD_DIM: tl.constexpr,
        DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCKS_PER_ITER: tl.constexpr,
        SPLIT: tl.constexpr, MERGE_CHUNK: tl.constexpr, F32_DOT: tl.constexpr,
    ):
        """One program per (sequence, kv head, split); split s takes tiles s, s + S, s + 2S, ... of
        the sequence (a tile = BLOCKS_PER_ITER cache blocks). With S > 1 the last split of a
        (sequence, kv head) to finish merges all of them, in the same launch."""
        seq = tl.program_id(0).to(tl.int64)
        kv_head = tl.program_id(1)
        split = tl.program_id(2)
        num_kv_heads = tl.num_programs(1)
        num_splits = tl.num_programs(2)
        TILE: tl.constexpr = BLOCKS_PER_ITER * BLOCK_SIZE

        seq_len = tl.load(seq_lens_ptr + seq)
        num_tiles = tl.cdiv(seq_len, TILE)

        g = tl.arange(0, GROUP_PAD)
        d = tl.arange(0, DIM_PAD)
        heads = kv_head * GROUP + g
        d_mask = (d < HEAD_DIM)[None, :]
        row_mask = (g < GROUP)[:, None] & d_mask
        q = tl.load(q_ptr + seq * q_s_seq + heads[:, None] * q_s_head + d[None, :], mask=row_mask, other=0.0)

        t = tl.arange(0, TILE)
        offset_in_block = t % BLOCK_SIZE
        table = block_tables_ptr + seq * bt_s_seq
        k_base = k_cache_ptr + kv_head * k_s_head + offset_in_block[:, None] * k_s_tok + d[None, :]
        v_base = v_cache_ptr + kv_head * v_s_head + offset_in_block[:, None] * v_s_tok + d[None, :]
        m = tl.full([GROUP_PAD], float("-inf"), tl.float32)  # running max, in log2 units
        l = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, DIM_PAD], tl.float32)
        # Interleaved tiles: every split's share differs by at most one tile, and a split's first
        # table read does not depend on how the sequence is divided.
        for tile in range(split, num_tiles, num_splits):
            token = tile * TILE + t
            valid = token < seq_len
            physical = tl.load(table + token // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
            kv_mask = valid[:, None] & d_mask
            k = tl.load(k_base + physical[:, None] * k_s_block, mask=kv_mask, other=0.0)
            v = tl.load(v_base + physical[:, None] * v_s_block, mask=kv_mask, other=0.0)
            m, l, acc = attend_tile(q, tl.trans(k), v, valid[None, :], m, l, acc, scale_log2, F32_DOT)

        has_work = l > 0.0  # false for a split without tiles and for a padded row (seq_len 0)
        result = acc / tl.where(has_work, l, 1.0)[:, None]
        if not SPLIT:
            tl.store(out_ptr + seq * o_s_seq + heads[:, None] * o_s_head + d[None, :],
                     result.to(out_ptr.dtype.element_ty), mask=row_mask)
        else:
            # Workspace rows [seq, kv head, split, group]: a (seq, kv head)'s partials are contiguous.
            pair = seq * num_kv_heads + kv_head
            # Only splits with tiles write (the merge reads those); the split test is broadcast to
            # a tensor because Triton's interpreter rejects a scalar inside a mask.
            row = (pair * num_splits + split) * GROUP + g
            row_live = (g < GROUP) & (tl.zeros([GROUP_PAD], tl.int32) + split < num_tiles)
            tl.store(part_out_ptr + row[:, None] * HEAD_DIM + d[None, :], result,
                     mask=row_live[:, None] & d_mask)
            lse = m + tl.log2(tl.where(has_work, l, 1.0))
            tl.store(part_lse_ptr + row, lse, mask=row_live)
            # Every thread's partial stores happen before the counter's release (barrier, then an
            # acq_rel atomic at GPU scope); the split that counts last sees all partials.
            tl.debug_barrier()
            counter = counters_ptr + pair
            finished_before = tl.atomic_add(counter, 1, sem="acq_rel")
            if finished_before == num_splits - 1:
                tl.atomic_xchg(counter, 0)  # zero again for the next launch / graph replay
                _merge_group(part_out_ptr, part_lse_ptr, out_ptr, pair * num_splits * GROUP,
                             seq * o_s_seq + kv_head * GROUP * o_s_head, o_s_head,
                             tl.minimum(num_tiles, num_splits), GROUP, 1, GROUP, GROUP_POW2, HEAD_DIM,
                             DIM_PAD, MERGE_CHUNK)
