"""The two-pass split-K decode kernel (the default, ``TWO_PASS_CONFIG``): contiguous block ranges
(or interleaved tiles) per split, then the merge kernel of :mod:`.merge`. Also the in-kernel steps
the split kernels share (``_split_start``, ``_metadata_read``, ``attend_tile``; the blocks and
one-pass kernels import them from here).
"""
from __future__ import annotations

from .config import LOG2E, decode_num_splits
from .device import _f32_dot, _launch_options, sm_count, triton
from .merge import _merge_chunk, _split_counters, merge_launch, run_merge, split_workspace

if triton is not None:
    import triton.language as tl

    from .device import _gdc_launch_dependents, _gdc_wait  # noqa: F401 - called by the Triton kernels
    from .merge import _merge_group


def _launch_two_pass(query, key_cache, value_cache, block_tables, seq_lens, scale, out, config, num_splits):
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    group = num_heads // num_kv_heads
    splits = num_splits or decode_num_splits(num_seqs, num_kv_heads, block_tables.shape[1],
                                             sm_count(query.device), config)
    blocks_per_iter = config.blocks_per_iter
    if splits == 1 and config.unsplit_tile_tokens:
        blocks_per_iter = max(blocks_per_iter, config.unsplit_tile_tokens // block_size)
    # tl.dot wants every tile dimension >= 16; padded query rows are computed and dropped.
    group_pad = max(16, triton.next_power_of_2(group))
    dim_pad = max(16, triton.next_power_of_2(head_dim))
    fused_merge = splits > 1 and config.fused_merge
    part_out, part_lse = split_workspace(out, splits)
    counters = _split_counters(query.device, num_seqs * num_kv_heads) if fused_merge else seq_lens
    # PDL: the grid-dependency instructions exist only in compiled code (paged_decode has refused
    # a CUDA device without them); the interpreter runs the same load order without them.
    gdc = config.pdl != "off" and query.is_cuda
    split_pdl = gdc and config.pdl in ("all", "early-metadata")  # the split kernel itself launched dependent
    merge_kernel = splits > 1 and not fused_merge
    _paged_decode_kernel[(num_seqs, num_kv_heads, splits)](
        query, key_cache, value_cache, block_tables, seq_lens, out, part_out, part_lse, counters,
        scale * LOG2E,
        query.stride(0), query.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1), block_tables.shape[1],
        GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=head_dim, DIM_PAD=dim_pad,
        BLOCK_SIZE=block_size, BLOCKS_PER_ITER=blocks_per_iter, SPLIT=splits > 1,
        # The merge's tile sizes are read only by the fused merge: constants otherwise, so that the
        # plain split kernel is compiled once.
        FUSED_MERGE=fused_merge, GROUP_POW2=triton.next_power_of_2(group) if fused_merge else 1,
        MERGE_CHUNK=_merge_chunk(group, dim_pad, config.num_warps) if fused_merge else 1,
        F32_DOT=_f32_dot(query), INTERLEAVED=config.interleaved, EARLY_METADATA=config.pdl == "early-metadata",
        PDL_WAIT=split_pdl, PDL_TRIGGER=gdc and merge_kernel,
        num_warps=config.num_warps, num_stages=config.num_stages,
        **_launch_options(split_pdl, config.max_registers if query.is_cuda else None),
    )
    if merge_kernel:
        run_merge(part_out, part_lse, out, splits, *merge_launch(splits, head_dim, dim_pad,
                                                                 config.merge_programs_per_head, gdc))


if triton is not None:

    @triton.jit
    def _split_start(PDL_TRIGGER: tl.constexpr, PDL_WAIT: tl.constexpr, EARLY_METADATA: tl.constexpr):
        """A split kernel's first instructions (two-pass and blocks kernels). PDL_TRIGGER: the merge
        kernel may be launched now; its programs become resident and wait (at their gdc_wait) for
        this whole grid, instead of being launched after it drains. PDL_WAIT: launched as a
        dependent of whatever kernel came before, so nothing is read (or written) before that kernel
        has finished and its writes are visible, except, with EARLY_METADATA, seq_len and the first
        table entries (then ``_metadata_read`` waits after them)."""
        if PDL_TRIGGER:
            _gdc_launch_dependents()
        if PDL_WAIT and not EARLY_METADATA:
            _gdc_wait()

    @triton.jit
    def _metadata_read(PDL_WAIT: tl.constexpr, EARLY_METADATA: tl.constexpr):
        """After a split kernel's seq_len and first table reads. EARLY_METADATA: they were requested
        before the wait, overlapping the previous kernel's tail; valid only when that kernel does
        not write seq_lens or the block table (an engine uploads them before the step's first
        kernel). Now the wait, before q and K/V are read."""
        if EARLY_METADATA:
            if PDL_WAIT:
                _gdc_wait()

    @triton.jit
    def attend_tile(q, k_t, v, score_mask, m, l, acc, scale_log2, F32_DOT: tl.constexpr):
        """One online-softmax step of a split over a K/V tile: scores q k^T in log2 units (masked
        by ``score_mask`` to -inf), the running max ``m``, sum ``l`` and output ``acc`` rescaled
        and updated; returns them. ``k_t`` is the K tile transposed ([..., head_size, tokens]);
        2D tiles and batched 3D ones alike (the tokens are the last axis of the scores). P@V takes
        p at the cache's precision, as on tensor cores. ``F32_DOT``: float32 products (float32
        inputs; the interpreter, which multiplies half-precision tiles wrongly)."""
        if F32_DOT:
            s = tl.dot(q.to(tl.float32), k_t.to(tl.float32), input_precision="ieee")
        else:
            s = tl.dot(q, k_t)
        s = tl.where(score_mask, s * scale_log2, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=-1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - tl.expand_dims(m_new, -1))
        l = l * alpha + tl.sum(p, axis=-1)
        p_low = p.to(v.dtype)
        if F32_DOT:
            pv = tl.dot(p_low.to(tl.float32), v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p_low, v)
        return m_new, l, acc * tl.expand_dims(alpha, -1) + pv

    @triton.jit
    def _paged_decode_kernel(
        q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, out_ptr, part_out_ptr, part_lse_ptr,
        counters_ptr, scale_log2,
        q_s_seq, q_s_head,
        k_s_block, k_s_tok, k_s_head,
        v_s_block, v_s_tok, v_s_head,
        bt_s_seq, o_s_seq, o_s_head, table_width,
        GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr,
        BLOCK_SIZE: tl.constexpr, BLOCKS_PER_ITER: tl.constexpr, SPLIT: tl.constexpr,
        FUSED_MERGE: tl.constexpr, GROUP_POW2: tl.constexpr, MERGE_CHUNK: tl.constexpr, F32_DOT: tl.constexpr,
        INTERLEAVED: tl.constexpr, EARLY_METADATA: tl.constexpr, PDL_WAIT: tl.constexpr,
        PDL_TRIGGER: tl.constexpr,
    ):
        seq = tl.program_id(0).to(tl.int64)
        kv_head = tl.program_id(1)
        split = tl.program_id(2)
        num_splits = tl.num_programs(2)
        TILE: tl.constexpr = BLOCKS_PER_ITER * BLOCK_SIZE
        _split_start(PDL_TRIGGER, PDL_WAIT, EARLY_METADATA)

        t = tl.arange(0, TILE)
        block_of_token = t // BLOCK_SIZE
        offset_in_block = t % BLOCK_SIZE
        table = block_tables_ptr + seq * bt_s_seq
        seq_len = tl.load(seq_lens_ptr + seq)
        num_blocks = tl.cdiv(seq_len, BLOCK_SIZE)
        if INTERLEAVED:
            # Split s takes tiles s, s+S, s+2S, ...: where a split starts is known without seq_len,
            # so its first table read is issued together with the seq_len read (bounded by the
            # table's width, a shape) instead of after it. Entries read past the sequence are never
            # dereferenced: the K/V loads are masked by seq_len. Unlike ranges cut from the table
            # width, every split still gets work when the table is much wider than the sequence.
            block_start = split * BLOCKS_PER_ITER
            block_end = num_blocks
            block_step = num_splits * BLOCKS_PER_ITER
            physical = tl.load(table + block_start + block_of_token,
                               mask=block_start + block_of_token < table_width, other=0)
        else:
            # This split's share of the sequence, in whole loop iterations (blocks_per_iter blocks
            # each), so that only the last tile of the sequence is partial.
            per_split = tl.cdiv(tl.cdiv(num_blocks, num_splits), BLOCKS_PER_ITER) * BLOCKS_PER_ITER
            block_start = split * per_split
            block_end = tl.minimum(block_start + per_split, num_blocks)
            block_step = BLOCKS_PER_ITER
        _metadata_read(PDL_WAIT, EARLY_METADATA)

        g = tl.arange(0, GROUP_PAD)
        d = tl.arange(0, DIM_PAD)
        heads = kv_head * GROUP + g
        row_mask = (g < GROUP)[:, None] & (d < HEAD_DIM)[None, :]
        q = tl.load(q_ptr + seq * q_s_seq + heads[:, None] * q_s_head + d[None, :], mask=row_mask, other=0.0)

        d_mask = (d < HEAD_DIM)[None, :]
        if not INTERLEAVED:
            # Table entries of the first tile; inside the loop, those of the next tile are requested
            # before this tile's math, so a K/V load never waits on a table load.
            physical = tl.load(table + block_start + block_of_token,
                               mask=block_start * BLOCK_SIZE + t < seq_len, other=0)
        m = tl.full([GROUP_PAD], float("-inf"), tl.float32)  # running max, in log2 units
        l = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, DIM_PAD], tl.float32)
        for block in range(block_start, block_end, block_step):
            valid = block * BLOCK_SIZE + t < seq_len
            kv_mask = valid[:, None] & d_mask
            rows = physical.to(tl.int64)[:, None]
            # K and V requested together: both reads are in flight while the QK dot waits on K.
            k = tl.load(k_cache_ptr + rows * k_s_block + offset_in_block[:, None] * k_s_tok
                        + kv_head * k_s_head + d[None, :], mask=kv_mask, other=0.0)
            v = tl.load(v_cache_ptr + rows * v_s_block + offset_in_block[:, None] * v_s_tok
                        + kv_head * v_s_head + d[None, :], mask=kv_mask, other=0.0)
            next_block = block + block_step
            physical = tl.load(table + next_block + block_of_token,
                               mask=next_block * BLOCK_SIZE + t < tl.minimum(seq_len, block_end * BLOCK_SIZE), other=0)
            m, l, acc = attend_tile(q, tl.trans(k), v, valid[None, :], m, l, acc, scale_log2, F32_DOT)

        has_work = l > 0.0  # false for an empty split and for a padded row (seq_len 0)
        result = acc / tl.where(has_work, l, 1.0)[:, None]
        if SPLIT:
            row = (seq * tl.num_programs(1) * GROUP + heads) * num_splits + split
            tl.store(part_out_ptr + row[:, None] * HEAD_DIM + d[None, :], result, mask=row_mask)
            lse = tl.where(has_work, m + tl.log2(tl.where(has_work, l, 1.0)), float("-inf"))
            tl.store(part_lse_ptr + row, lse, mask=g < GROUP)
            if FUSED_MERGE:
                # Every thread's partial stores happen before the counter's release (barrier, then
                # an acq_rel atomic at GPU scope); the split that counts last sees all partials.
                tl.debug_barrier()
                counter = counters_ptr + seq * tl.num_programs(1) + kv_head
                finished_before = tl.atomic_add(counter, 1, sem="acq_rel")
                if finished_before == num_splits - 1:
                    tl.atomic_xchg(counter, 0)  # zero again for the next launch / graph replay
                    # The group's heads at once, MERGE_CHUNK splits at a time: merging a head's
                    # SPLITS_PAD x head_dim floats in one piece spilled (255 registers on the H200).
                    # Rows [seq, head, split]: split stride 1, head stride num_splits.
                    _merge_group(part_out_ptr, part_lse_ptr, out_ptr,
                                 (seq * tl.num_programs(1) * GROUP + kv_head * GROUP) * num_splits,
                                 seq * o_s_seq + kv_head * GROUP * o_s_head, o_s_head, num_splits,
                                 1, num_splits, GROUP, GROUP_POW2, HEAD_DIM, DIM_PAD, MERGE_CHUNK)
        else:
            tl.store(out_ptr + seq * o_s_seq + heads[:, None] * o_s_head + d[None, :],
                     result.to(out_ptr.dtype.element_ty), mask=row_mask)
