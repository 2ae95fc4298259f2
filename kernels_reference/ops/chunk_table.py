"""Where each chunk of a packed batch of sequences starts and ends, built on the device.

The chunked scans (Mamba-2's SSD, the gated delta rule, GLA, RWKV-7) cut every sequence of a packed
batch into chunks from its own first token, so no chunk holds two sequences. Their grids are sized
by an upper bound on the chunk count known on the host, ``ceil(tokens / chunk) + sequences``, and
one Triton program fills the table from ``cu_seqlens``: nothing reads device values on the host, so
a prefill neither stalls the GPU on a sync nor stops a CUDA-graph capture. Chunks past the real
count are empty (length 0; start = end = 0), and the scans' programs of those chunks do nothing.

(A CUDA graph replays the one launch where the same table in torch ops was about fifteen small
kernels: ~40 of a 4096-token Mamba-2 scan's 283 us on an H100, 2026-12-05. The delta-rule family
built its table on the host until 2026-12-07: a device-to-host copy and a dozen host ops in every
prefill call, during which the GPU waits.)
"""
from typing import NamedTuple

import torch

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None


def chunk_bound(tokens: int, sequences: int, chunk_size: int) -> int:
    """At least as many chunks as any packing of ``tokens`` into ``sequences`` sequences gives."""
    return -(-tokens // chunk_size) + sequences


def chunk_table(cu_seqlens: torch.Tensor, tokens: int, chunk_size: int):
    """Per chunk (sequence, first token, length; length 0 for the unused tail of the bound) and per
    sequence (first chunk, chunk count), as device tensors: ``(bound, seq, start, length, first, count)``."""
    sequences = cu_seqlens.numel() - 1
    bound = chunk_bound(tokens, sequences, chunk_size)
    i32, dev = torch.int32, cu_seqlens.device
    seq, start, length = (torch.empty(bound, dtype=i32, device=dev) for _ in range(3))
    first, count = (torch.empty(sequences, dtype=i32, device=dev) for _ in range(2))
    _launch(cu_seqlens, seq, start, length, first, count, sequences, bound, chunk_size, pairs=False)
    return bound, seq, start, length, first, count


class ChunkPairs(NamedTuple):
    table: torch.Tensor  # int32 [bound, 2]: (first token, end token) of every chunk; (0, 0) past the real count
    first_chunk: torch.Tensor  # int32 [N]: index in ``table`` of each sequence's first chunk


def chunk_pairs(cu_seqlens: torch.Tensor, tokens: int, chunk_size: int) -> ChunkPairs:
    """The same chunks as ``chunk_table``, as (start, end) rows: the layout the delta-rule family's
    kernels read."""
    sequences = cu_seqlens.numel() - 1
    bound = chunk_bound(tokens, sequences, chunk_size)
    dev = cu_seqlens.device
    table = torch.empty((bound, 2), dtype=torch.int32, device=dev)
    first = torch.empty(sequences, dtype=torch.int32, device=dev)
    _launch(cu_seqlens, table, table, table, first, first, sequences, bound, chunk_size, pairs=True)
    return ChunkPairs(table, first)


def _launch(cu_seqlens, seq, start, length, first, count, sequences, bound, chunk_size, pairs: bool):
    block_s = triton.next_power_of_2(max(sequences, 1))
    _chunk_table_kernel[(1,)](cu_seqlens, seq, start, length, first, count, sequences, bound, chunk_size,
                              PAIRS=pairs, BLOCK_S=block_s, BLOCK_C=max(16, min(64, 8192 // block_s)),
                              num_warps=4)


if triton is not None:

    @triton.jit
    def _chunk_table_kernel(cu_ptr, seq_ptr, start_ptr, len_ptr, first_ptr, count_ptr, n, bound, chunk,
                            PAIRS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr):
        """PAIRS: (start, end) rows into ``start_ptr`` and the first chunks only; else the separate
        sequence, start and length columns and the first chunks and counts."""
        s = tl.arange(0, BLOCK_S)
        s_ok = s < n
        lo = tl.load(cu_ptr + s, mask=s_ok, other=0).to(tl.int32)
        hi = tl.load(cu_ptr + s + 1, mask=s_ok, other=0).to(tl.int32)
        counts = (hi - lo + chunk - 1) // chunk
        ends = tl.cumsum(counts, 0)
        firsts = ends - counts
        tl.store(first_ptr + s, firsts, mask=s_ok)
        if not PAIRS:
            tl.store(count_ptr + s, counts, mask=s_ok)
        for c0 in range(0, bound, BLOCK_C):
            ids = c0 + tl.arange(0, BLOCK_C)
            # a chunk's sequence: how many sequences' chunks end at or before it
            seq = tl.sum(((ends[None, :] <= ids[:, None]) & s_ok[None, :]).to(tl.int32), 1)
            valid = seq < n
            mine = s[None, :] == seq[:, None]  # that sequence's column, for gathering its values
            seq_lo = tl.sum(tl.where(mine, lo[None, :], 0), 1)
            seq_hi = tl.sum(tl.where(mine, hi[None, :], 0), 1)
            start = tl.where(valid, seq_lo + (ids - tl.sum(tl.where(mine, firsts[None, :], 0), 1)) * chunk, 0)
            length = tl.where(valid, tl.minimum(seq_hi - start, chunk), 0)
            in_bound = ids < bound
            if PAIRS:
                tl.store(start_ptr + 2 * ids, start, mask=in_bound)
                tl.store(start_ptr + 2 * ids + 1, start + length, mask=in_bound)
            else:
                tl.store(seq_ptr + ids, tl.minimum(seq, tl.maximum(n - 1, 0)), mask=in_bound)
                tl.store(start_ptr + ids, start, mask=in_bound)
                tl.store(len_ptr + ids, length, mask=in_bound)
