"""What reading a paged-decode case's bytes costs without the attention: the ceilings the peer
benchmark times beside the reference (``fk_pytest.peers.Ceiling``), so that batch-1 long-context
decode is held to the fastest read of its own bytes (issue "Attention measured against the kernels
serving stacks run": a pure read of the same bytes reached 0.73 of copy on the H200, so a bar of
copy bandwidth there cannot be met by any kernel).

* ``paged``: every cache block of every sequence read through its block table, K and V, one program
  per (block, sequence): the reads the attention kernel must make, in the cache's own layout.
* ``contiguous``: as many bytes read from one contiguous range of each cache with ``torch.sum``
  (float32 accumulation): the same byte count with no table to follow.

Each returns a small tensor that depends on every byte read, so nothing is skipped.
"""
import torch

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

READ_BLOCK = 2048  # elements per load step of one cache block


def _layer_caches(inputs):
    return inputs["k_cache_0"], inputs["v_cache_0"]


def _blocks_per_sequence(meta, page: int):
    return [-(-n // page) for n in meta.seq_lens_cpu]


def paged_read(inputs) -> torch.Tensor:
    """Sum of every cached K and V element of every sequence, block by block through its table."""
    meta = inputs["metadata"]
    k, v = _layer_caches(inputs)
    page = k.shape[1]
    width = max(_blocks_per_sequence(meta, page))
    out = torch.zeros((meta.num_seqs, width), dtype=torch.float32, device=k.device)  # blocks past a sequence: 0
    block_elems = k[0].numel()
    _read_blocks_kernel[(width, meta.num_seqs)](k, v, meta.block_tables, meta.seq_lens, out,
                                                meta.block_tables.stride(0), block_elems, width, page,
                                                BLOCK=min(READ_BLOCK, triton.next_power_of_2(block_elems)))
    return out


def contiguous_read(inputs) -> torch.Tensor:
    """As many bytes as the sequences' cached blocks, read from the start of each cache at once."""
    meta = inputs["metadata"]
    k, v = _layer_caches(inputs)
    elems = sum(_blocks_per_sequence(meta, k.shape[1])) * k[0].numel()
    return torch.sum(k.view(-1)[:elems], dtype=torch.float32) + torch.sum(v.view(-1)[:elems], dtype=torch.float32)


if triton is not None:

    @triton.jit
    def _read_blocks_kernel(k_ptr, v_ptr, table_ptr, lens_ptr, out_ptr, table_stride, block_elems, width, page,
                            BLOCK: tl.constexpr):
        blk = tl.program_id(0)
        seq = tl.program_id(1)
        if blk * page >= tl.load(lens_ptr + seq):
            return
        base = tl.load(table_ptr + seq * table_stride + blk).to(tl.int64) * block_elems
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        for start in range(0, block_elems, BLOCK):
            idx = start + tl.arange(0, BLOCK)
            ok = idx < block_elems
            acc += tl.load(k_ptr + base + idx, mask=ok, other=0.0).to(tl.float32)
            acc += tl.load(v_ptr + base + idx, mask=ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + seq * width + blk, tl.sum(acc, axis=0))
