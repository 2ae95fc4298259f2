"""Merging the splits' partial outputs: the split workspace, the merge kernel (``run_merge``), and
the in-kernel merge of a fused / one-pass launch (``_merge_group``, with its counters).
"""
from __future__ import annotations

import torch

from ..launch_counters import zeroed_counters
from .device import _launch_options, triton

if triton is not None:
    import triton.language as tl

    from .device import _gdc_launch_dependents, _gdc_wait


def split_workspace(out: torch.Tensor, splits: int):
    """(partial outputs [seq, head, split, width] float32, their log-sum-exps [seq, head, split])
    for ``out`` [seq, head, width]: the rows the merge kernel reads. One split writes ``out``
    directly, so both are then ``out`` itself (the pointers are unused)."""
    if splits <= 1:
        return out, out
    num_seqs, num_heads, width = out.shape
    return (torch.empty(num_seqs, num_heads, splits, width, dtype=torch.float32, device=out.device),
            torch.empty(num_seqs, num_heads, splits, dtype=torch.float32, device=out.device))


MERGE_STEP_FLOATS = 16384  # partial floats a merge program loads per step


def merge_launch(splits: int, head_dim: int, dim_pad: int, programs_per_head: int, pdl: bool):
    """The merge kernel's programs per head and constants: each program merges DIM_CHUNK of a
    head's head_dim, SPLIT_CHUNK splits per step, a step's partials at most 16384 floats (128 per
    thread of 4 warps: one step, one round trip, up to 128 splits of head size 128)."""
    dim_chunk = max(1, dim_pad // programs_per_head)  # more programs than padded head_dim: one element each
    split_chunk = min(triton.next_power_of_2(splits), max(1, MERGE_STEP_FLOATS // dim_chunk))
    return merge_meta(splits, head_dim, dim_chunk, split_chunk, pdl)


def merge_meta(splits: int, head_dim: int, dim_chunk: int, split_chunk: int, pdl: bool):
    """(programs per head, the merge kernel's constants) for slices of ``dim_chunk`` and steps of
    ``split_chunk`` splits; a slice wholly past a non-power-of-two head_dim is not launched."""
    return -(-head_dim // dim_chunk), dict(HEAD_DIM=head_dim, DIM_CHUNK=dim_chunk, SPLIT_CHUNK=split_chunk,
                                           ONE_STEP=split_chunk >= splits, PDL=pdl)


def run_merge(part_out, part_lse, out, splits: int, chunks: int, meta: dict):
    """The merge kernel over ``split_workspace``'s rows into ``out`` [seq, head, width]."""
    _merge_splits_kernel[(out.shape[0], out.shape[1], chunks)](
        part_out, part_lse, out, out.stride(0), out.stride(1), splits, **meta,
        num_warps=4, **_launch_options(meta["PDL"]))


def _merge_chunk(group: int, dim_pad: int, num_warps: int) -> int:
    """Splits merged per step by a fused merge: MERGE_CHUNK x group x head_size floats, about 64 per
    thread (a power of two)."""
    chunk = max(1, (64 * 32 * num_warps) // (triton.next_power_of_2(group) * dim_pad))
    return 1 << (chunk.bit_length() - 1)


def _split_counters(device: torch.device, needed: int) -> torch.Tensor:
    """Zeroed int32 counters, one per (sequence, kv head), for the fused merge; the merging program
    resets its counter, so every launch leaves them at zero."""
    return zeroed_counters(device, needed, "paged_decode_merge")


if triton is not None:

    @triton.jit
    def _merge_splits_kernel(
        part_out_ptr, part_lse_ptr, out_ptr, o_s_seq, o_s_head, num_splits,
        HEAD_DIM: tl.constexpr, DIM_CHUNK: tl.constexpr, SPLIT_CHUNK: tl.constexpr, ONE_STEP: tl.constexpr,
        PDL: tl.constexpr,
    ):
        """out = sum_s w_s * part_s / sum_s w_s with w_s = 2^(lse_s - max lse), for one head
        (program axis 1) and DIM_CHUNK of its head_dim (axis 2), SPLIT_CHUNK splits per step with
        a running max. Each step's lse and partial loads are issued before either is used (one
        round trip per step). Partials are read at L2 (``.cg``): the split kernel just wrote them."""
        seq = tl.program_id(0).to(tl.int64)
        head = tl.program_id(1)
        if PDL:
            # Launched while the split kernel still runs: let the next dependent kernel launch too,
            # then wait until the split kernel has finished and its partials are visible. Nothing
            # is read or written before the wait.
            _gdc_launch_dependents()
            _gdc_wait()
        row0 = (seq * tl.num_programs(1) + head) * num_splits
        s = tl.arange(0, SPLIT_CHUNK)
        d = tl.program_id(2) * DIM_CHUNK + tl.arange(0, DIM_CHUNK)
        d_mask = d < HEAD_DIM
        if ONE_STEP:
            # Every split in one step, without the running max (straight-line code: on the H200 the
            # loop form of one step cost the B1 C8192 decode about 0.5 us, docs/perf run 11).
            s_mask = s < num_splits
            lse = tl.load(part_lse_ptr + row0 + s, mask=s_mask, other=float("-inf"), cache_modifier=".cg")
            parts = tl.load(part_out_ptr + (row0 + s)[:, None] * HEAD_DIM + d[None, :],
                            mask=s_mask[:, None] & d_mask[None, :], other=0.0, cache_modifier=".cg")
            top = tl.max(lse, axis=0)
            top = tl.where(top == float("-inf"), 0.0, top)  # every split empty: weights 0, output 0
            w = tl.exp2(lse - top)
            total = tl.sum(w, axis=0)
            merged = tl.sum(parts * w[:, None], axis=0) / tl.where(total > 0.0, total, 1.0)
            tl.store(out_ptr + seq * o_s_seq + head * o_s_head + d, merged.to(out_ptr.dtype.element_ty), mask=d_mask)
            return
        top = tl.max(tl.full([SPLIT_CHUNK], float("-inf"), tl.float32), axis=0)
        total = tl.sum(tl.zeros([SPLIT_CHUNK], tl.float32), axis=0)
        merged = tl.zeros([DIM_CHUNK], tl.float32)
        for first in range(0, num_splits, SPLIT_CHUNK):
            s_mask = first + s < num_splits
            lse = tl.load(part_lse_ptr + row0 + first + s, mask=s_mask, other=float("-inf"), cache_modifier=".cg")
            parts = tl.load(part_out_ptr + (row0 + first + s)[:, None] * HEAD_DIM + d[None, :],
                            mask=s_mask[:, None] & d_mask[None, :], other=0.0, cache_modifier=".cg")
            new_top = tl.maximum(top, tl.max(lse, axis=0))
            base = tl.where(new_top == float("-inf"), 0.0, new_top)  # every split so far empty: weights 0
            w = tl.exp2(lse - base)
            rescale = tl.exp2(top - base)
            total = total * rescale + tl.sum(w, axis=0)
            merged = merged * rescale + tl.sum(parts * w[:, None], axis=0)
            top = new_top
        merged = merged / tl.where(total > 0.0, total, 1.0)
        tl.store(out_ptr + seq * o_s_seq + head * o_s_head + d, merged.to(out_ptr.dtype.element_ty), mask=d_mask)

    @triton.jit
    def _merge_group(part_out_ptr, part_lse_ptr, out_ptr, row0, out_offset, o_s_head, active_splits,
                     split_stride, head_stride,
                     GROUP: tl.constexpr, GROUP_POW2: tl.constexpr, HEAD_DIM: tl.constexpr,
                     DIM_PAD: tl.constexpr, MERGE_CHUNK: tl.constexpr):
        """The GROUP heads of one (sequence, kv head) from its first ``active_splits`` partials (the
        splits that had tiles), MERGE_CHUNK splits at a time with a running max; the partial of
        split s, head g is row ``row0 + s * split_stride + g * head_stride``. Partials are read
        at L2 (``.cg``): other SMs wrote them during this launch."""
        c = tl.arange(0, MERGE_CHUNK)[:, None]
        g = tl.arange(0, GROUP_POW2)[None, :]
        d = tl.arange(0, DIM_PAD)[None, None, :]
        top = tl.full([GROUP_POW2], float("-inf"), tl.float32)
        total = tl.zeros([GROUP_POW2], tl.float32)
        merged = tl.zeros([GROUP_POW2, DIM_PAD], tl.float32)
        for first in range(0, active_splits, MERGE_CHUNK):
            mask = ((first + c) < active_splits) & (g < GROUP)  # [chunk, group]
            row = row0 + (first + c) * split_stride + g * head_stride
            lse = tl.load(part_lse_ptr + row, mask=mask, other=float("-inf"), cache_modifier=".cg")
            parts = tl.load(part_out_ptr + row[:, :, None] * HEAD_DIM + d,
                            mask=mask[:, :, None] & (d < HEAD_DIM), other=0.0, cache_modifier=".cg")
            new_top = tl.maximum(top, tl.max(lse, axis=0))
            base = tl.where(new_top == float("-inf"), 0.0, new_top)  # nothing yet: weights 0
            w = tl.exp2(lse - base[None, :])
            rescale = tl.exp2(top - base)
            total = total * rescale + tl.sum(w, axis=0)
            merged = merged * rescale[:, None] + tl.sum(parts * w[:, :, None], axis=0)
            top = new_top
        merged = merged / tl.where(total > 0.0, total, 1.0)[:, None]
        gg = tl.arange(0, GROUP_POW2)[:, None]
        dd = tl.arange(0, DIM_PAD)[None, :]
        tl.store(out_ptr + out_offset + gg * o_s_head + dd, merged.to(out_ptr.dtype.element_ty),
                 mask=(gg < GROUP) & (dd < HEAD_DIM))
