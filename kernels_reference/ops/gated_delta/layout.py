"""How the gated delta rule's kernels address their inputs.

Production hands the op views: q, k and v are slices of the short convolution's output (one fused
[T, 2 * key_dim + value_dim] buffer), so a token's heads are not packed next to the next token's.
The kernels therefore take a token stride and a head stride per tensor instead of copying; only
the innermost dimension must be contiguous.
"""
from typing import NamedTuple, Optional

import torch

from ..chunk_table import chunk_pairs

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None


class TokenHeads(NamedTuple):
    tensor: torch.Tensor  # [T, H, D] or [T, H]
    token_stride: int
    head_stride: int


def token_heads(x: torch.Tensor) -> TokenHeads:
    """``x`` without its batch dimension of 1, as the kernels address it."""
    x = x[0]
    if x.dim() == 3 and x.stride(-1) != 1:
        x = x.contiguous()
    return TokenHeads(x, x.stride(0), x.stride(1))


def scan_outputs(v: TokenHeads, key_dim: int, sequences: int, initial_state: Optional[torch.Tensor],
                 output_final_state: bool):
    """A scan's outputs, unwritten: o [T, H, V] in v's dtype and, if asked for, the final states
    [N, H, K, V] in float32; and whether there is nothing to scan (no sequence or no token), in
    which case the final states already hold the initial ones (or zeros)."""
    t, heads, vd = v.tensor.shape
    o = torch.empty((t, heads, vd), dtype=v.tensor.dtype, device=v.tensor.device)
    final = (torch.empty((sequences, heads, key_dim, vd), dtype=torch.float32, device=v.tensor.device)
             if output_final_state else None)
    nothing = sequences == 0 or t == 0
    if nothing and final is not None:
        final.copy_(initial_state if initial_state is not None else torch.zeros_like(final))
    return o, final, nothing


def chunked_scan_start(v: TokenHeads, key_dim: int, cu_seqlens: torch.Tensor, initial_state: Optional[torch.Tensor],
                       output_final_state: bool, chunk: int):
    """The start of a chunked scan's host function: its outputs (:func:`scan_outputs`), the chunk
    table (:func:`chunk_pairs`: built on the device for an upper bound of chunks, so the grids hold
    empty chunks past the real count; None when there is nothing to scan: the outputs are then
    final), and the products' constexprs, ``DOT_T`` (operand type) and ``EMULATE`` (half products
    upcast: the interpreter)."""
    o, final, nothing = scan_outputs(v, key_dim, cu_seqlens.numel() - 1, initial_state, output_final_state)
    layout = None if nothing else chunk_pairs(cu_seqlens, v.tensor.shape[0], chunk)
    x = v.tensor
    return o, final, layout, dict(DOT_T=DOT_TYPES[x.dtype], EMULATE=interpreting() or not x.is_cuda)


def packed_batch(tensors, cu_seqlens):
    """A recurrence's call as one packed batch (``tensors`` [B, T, ...] as the op takes them):
    with ``cu_seqlens`` the batch dimension must be 1 and the tensors are returned as they are;
    without, B equal-length rows become B sequences of ``cu_seqlens``. Returns (tensors, cu_seqlens)."""
    if cu_seqlens is not None:
        if tensors[0].shape[0] != 1:
            raise ValueError(f"with cu_seqlens the batch dimension must be 1, got {tensors[0].shape[0]}")
        return tuple(tensors), cu_seqlens
    b, t = tensors[0].shape[:2]
    cu = torch.arange(b + 1, dtype=torch.int32, device=tensors[0].device) * t
    return tuple(x.reshape(1, b * t, *x.shape[2:]) for x in tensors), cu


def interpreting() -> bool:
    from ...triton_rows import interpreting as _interpreting
    return _interpreting()


if triton is not None:
    # the products' operand type per activation dtype (half types on the tensor cores)
    DOT_TYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}

    @triton.jit
    def store_rows(ptr, rows, row_ok, H: tl.constexpr, i_h, cols, width, value):
        """``value`` [rows, cols] into head i_h of a [T, H, width] buffer, in the buffer's dtype; rows
        the chunk does not hold and columns past width are left alone (the counterpart of ``tile``)."""
        out_rows = rows.to(tl.int64)[:, None] * H + i_h
        tl.store(ptr + out_rows * width + cols[None, :], value.to(ptr.dtype.element_ty),
                 mask=row_ok[:, None] & (cols < width)[None, :])

    @triton.jit
    def chunk_is_empty(table, i_c):
        """Whether chunk i_c of a ``chunk_pairs`` table is past the real count (its grids are sized
        by an upper bound): its programs return at once."""
        return tl.load(table + 2 * i_c + 1) <= tl.load(table + 2 * i_c)

    @triton.jit
    def chunk_rows(table, i_c, BT: tl.constexpr):
        """Chunk i_c of a ``chunk_pairs`` table: the BT token rows from its first token, and which
        of them the chunk holds."""
        start = tl.load(table + 2 * i_c)
        end = tl.load(table + 2 * i_c + 1)
        rows = start + tl.arange(0, BT)
        return rows, rows < end

    @triton.jit
    def walk_start(h0, cu_seqlens, first_chunk, i_n, i_nh, offsets, mask, K: tl.constexpr, V: tl.constexpr,
                   BK: tl.constexpr, BV: tl.constexpr, HAS_H0: tl.constexpr):
        """Where a serial walk over sequence i_n's chunks starts: the sequence's first token and end,
        its first chunk's index in the table, and the [BK, BV] state slice at ``offsets`` of state
        i_nh in float32 (the initial state's, or zeros)."""
        bos = tl.load(cu_seqlens + i_n)
        eos = tl.load(cu_seqlens + i_n + 1)
        chunk = tl.load(first_chunk + i_n).to(tl.int64)
        h = tl.zeros((BK, BV), dtype=tl.float32)
        if HAS_H0:
            h = tl.load(h0 + i_nh.to(tl.int64) * K * V + offsets, mask=mask, other=0.0).to(tl.float32)
        return bos, eos, chunk, h

    @triton.jit
    def mm(a, b, DOT_T: tl.constexpr, EMULATE: tl.constexpr):
        """a @ b with both operands rounded to DOT_T and float32 accumulation (half operands: tensor
        cores; float32 ones: full precision, no TF32). The interpreter reads half tiles' raw bits in
        dot, so there the rounded operands are upcast again before multiplying."""
        if EMULATE or DOT_T == tl.float32:
            return tl.dot(a.to(DOT_T).to(tl.float32), b.to(DOT_T).to(tl.float32), input_precision="ieee")
        else:
            return tl.dot(a.to(DOT_T), b.to(DOT_T))

    @triton.jit
    def tile(ptr, rows, row_ok, token_stride, head_offset, cols, width):
        """[rows, cols] of one head as float32; rows past the chunk and columns past width read 0."""
        p = ptr + rows.to(tl.int64)[:, None] * token_stride + head_offset + cols[None, :]
        return tl.load(p, mask=row_ok[:, None] & (cols < width)[None, :], other=0.0).to(tl.float32)
