"""Rotary position embedding, as vLLM's ``RotaryEmbedding`` (plus Llama-3 frequency scaling).

``forward(positions[T], query[T, nq*head_size], key[T, nk*head_size]) -> (query, key)``. The first
``rotary_dim`` features of every head rotate, the rest pass through. Neox style rotates the two
halves of the rotary part against each other; GPT-J (interleaved) style rotates even/odd pairs.

Numerics follow production: inverse frequencies and angles ``position * inv_freq`` in float32 (so
large positions carry float32 angle error, as they do in vLLM and HF), cos/sin in float32, the
rotation in float32 and one rounding to the input dtype. The module holds no persistent state: its
cos/sin table is derived from the constructor arguments.

The fast path rotates ``query`` and ``key`` in place (as production does) and returns them; the
native path returns new tensors. Callers must not rely on either.
"""
import math
from typing import Optional, Tuple

import torch
from torch import nn

from ..dispatch import use_fast_path
from ..records import RecordsInit

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None


class RotaryEmbedding(RecordsInit, nn.Module):
    def __init__(
        self,
        head_size: int,
        rotary_dim: int,
        max_position_embeddings: int,
        base: float,
        is_neox_style: bool = True,
        rope_scaling: Optional[dict] = None,
    ):
        super().__init__()
        if rotary_dim > head_size or rotary_dim % 2:
            raise ValueError(f"rotary_dim={rotary_dim} must be even and <= head_size={head_size}")
        self.head_size = head_size
        self.rotary_dim = rotary_dim
        self.max_position_embeddings = max_position_embeddings
        self.base = base
        self.is_neox_style = is_neox_style
        self.rope_scaling = dict(rope_scaling) if rope_scaling else None
        kind = (self.rope_scaling or {}).get("rope_type", (self.rope_scaling or {}).get("type", "default"))
        if kind not in ("default", "llama3"):
            raise NotImplementedError(f"rope_scaling type {kind!r} is not implemented")
        self._scaling = kind
        self._tables = {}  # (device, dtype) -> cos/sin table, built on first use

    # ---- frequencies -------------------------------------------------------------------------
    def inv_freq(self, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
        # Built on the positions' device: under torch.compile a CPU constant would become a
        # host-to-device copy inside the graph, which CUDA-graph capture refuses.
        exponents = torch.arange(0, self.rotary_dim, 2, dtype=dtype, device=device) / self.rotary_dim
        inv_freq = 1.0 / (self.base ** exponents)
        if self._scaling == "llama3":
            inv_freq = _llama3_scale(inv_freq, self.rope_scaling)
        return inv_freq

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
        """cos and sin, each [T, rotary_dim // 2], of the angles ``position * inv_freq``."""
        angles = positions.to(dtype)[:, None] * self.inv_freq(dtype, positions.device)[None, :]
        return angles.cos(), angles.sin()

    def cos_sin_table(self, device: torch.device) -> torch.Tensor:
        """[max_position, rotary_dim] float32 table (cos half, then sin half) for the fast path."""
        key = (str(device), torch.float32)
        if key not in self._tables:
            positions = torch.arange(self.table_positions(), device=device)
            cos, sin = self.cos_sin(positions, torch.float32)
            self._tables[key] = torch.cat([cos, sin], dim=-1).contiguous()
        return self._tables[key]

    def table_rows(self, positions: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(cos/sin table, the row of each token) for a Triton kernel. On CUDA the whole
        max-position table, read at the positions (no host value involved, graph-safe). In the
        interpreter (CPU) a table of just these tokens' angles, read at row = token, instead of
        building the whole max-position table for every new module."""
        if positions.is_cuda:
            return self.cos_sin_table(positions.device), positions
        cos, sin = self.cos_sin(positions.reshape(-1), torch.float32)
        return torch.cat([cos, sin], dim=-1).contiguous(), torch.arange(positions.numel(), device=positions.device)

    def table_positions(self) -> int:
        """Positions the fast path's table covers (YaRN variants cover the extended context)."""
        return self.max_position_embeddings

    # ---- forward ------------------------------------------------------------------------------
    def forward(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor):
        if triton is not None and use_fast_path(positions, query, key):
            return self.forward_triton(positions, query, key)
        return self.forward_native(positions, query, key)

    def forward_native(self, positions, query, key):
        compute = torch.float64 if query.dtype == torch.float64 else torch.float32
        cos, sin = self.cos_sin(positions.reshape(-1), compute)
        return self._rotate_native(query, cos, sin), self._rotate_native(key, cos, sin)

    def _rotate_native(self, x, cos, sin):
        shape, dtype = x.shape, x.dtype
        x = x.reshape(shape[0], -1, self.head_size).to(cos.dtype)
        rot, passthrough = x[..., : self.rotary_dim], x[..., self.rotary_dim :]
        cos, sin = cos[:, None, :], sin[:, None, :]
        if self.is_neox_style:
            x1, x2 = rot.chunk(2, dim=-1)
            rot = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
        else:
            x1, x2 = rot[..., 0::2], rot[..., 1::2]
            rot = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
        return torch.cat([rot, passthrough], dim=-1).to(dtype).reshape(shape)

    def forward_triton(self, positions, query, key):
        q_rows, k_rows = _head_rows(query, self.head_size), _head_rows(key, self.head_size)
        self._rotate_rows_triton(positions, q_rows, k_rows)
        # In place where the rows were views of the inputs; copies come back in the inputs' shapes.
        return _in_shape_of(query, q_rows), _in_shape_of(key, k_rows)

    def _rotate_rows_triton(self, positions, query, key):
        n_tokens = positions.numel()
        if n_tokens == 0:
            return
        table, positions = self.table_rows(positions)
        half = self.rotary_dim // 2
        nq, nk = query.shape[1], key.shape[1]
        # q and k heads form one list of nq + nk rows per token, cut into equal head blocks: every
        # program moves the same amount of data (Llama's 32 q + 8 k heads: 5 blocks of 8). The
        # interpreter takes them all at once (it pays per program, not per element).
        heads_block = min(8 if query.is_cuda else 64, triton.next_power_of_2(nq + nk))
        half_block = triton.next_power_of_2(half)
        _rope_kernel[(n_tokens, triton.cdiv(nq + nk, heads_block))](
            positions.reshape(-1), query, key, table,
            query.stride(0), query.stride(1), key.stride(0), key.stride(1), nq, nk, table.stride(0), half,
            IS_NEOX=self.is_neox_style, HEADS_BLOCK=heads_block, HALF_BLOCK=half_block,
            num_warps=4 if heads_block * half_block >= 512 else 2,
        )


def _in_shape_of(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    return x if _same_storage(x, rows) else rows.reshape(x.shape)


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _head_rows(x: torch.Tensor, head_size: int) -> torch.Tensor:
    """A [T, heads, head_size] view with a unit inner stride, which the kernel rotates in place: the
    packed [T, heads*head_size] rows of a qkv slice, or per-head views with a wider head stride
    (DeepSeek's rope part, ``q[..., nope:]`` of [T, heads, nope + rope]). Else a contiguous copy."""
    t = x.shape[0]
    try:
        view = x.view(t, -1, head_size)
    except RuntimeError:
        view = None
    if view is None and x.dim() == 3 and x.shape[-1] == head_size:
        view = x
    if view is None or view.stride(-1) != 1:
        view = x.reshape(t, -1, head_size).contiguous()
    return view


def _llama3_scale(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    factor = scaling["factor"]
    low_freq_factor = scaling["low_freq_factor"]
    high_freq_factor = scaling["high_freq_factor"]
    old_context = scaling["original_max_position_embeddings"]
    low_freq_wavelen = old_context / low_freq_factor
    high_freq_wavelen = old_context / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    return torch.where(
        wavelen < high_freq_wavelen,
        inv_freq,
        torch.where(wavelen > low_freq_wavelen, inv_freq / factor, blended),
    )


if triton is not None:

    @triton.jit
    def _rope_kernel(
        pos_ptr, q_ptr, k_ptr, table_ptr,
        q_row_stride, q_head_stride, k_row_stride, k_head_stride, n_q_heads, n_k_heads, table_row_stride,
        half,
        IS_NEOX: tl.constexpr, HEADS_BLOCK: tl.constexpr, HALF_BLOCK: tl.constexpr,
    ):
        token = tl.program_id(0).to(tl.int64)
        heads = tl.program_id(1) * HEADS_BLOCK + tl.arange(0, HEADS_BLOCK)
        is_q = heads < n_q_heads
        head_base = tl.where(is_q, q_ptr + token * q_row_stride + heads * q_head_stride,
                             k_ptr + token * k_row_stride + (heads - n_q_heads) * k_head_stride)
        pos = tl.load(pos_ptr + token).to(tl.int64)
        pairs = tl.arange(0, HALF_BLOCK)
        pair_mask = pairs < half
        cos = tl.load(table_ptr + pos * table_row_stride + pairs, mask=pair_mask, other=0.0)
        sin = tl.load(table_ptr + pos * table_row_stride + half + pairs, mask=pair_mask, other=0.0)
        if IS_NEOX:
            first, second = pairs, pairs + half
        else:
            first, second = 2 * pairs, 2 * pairs + 1
        mask = (heads[:, None] < n_q_heads + n_k_heads) & pair_mask[None, :]
        p1 = head_base[:, None] + first[None, :]
        p2 = head_base[:, None] + second[None, :]
        x1 = tl.load(p1, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(p2, mask=mask, other=0.0).to(tl.float32)
        out_ty = q_ptr.dtype.element_ty
        tl.store(p1, (x1 * cos[None, :] - x2 * sin[None, :]).to(out_ty), mask=mask)
        tl.store(p2, (x2 * cos[None, :] + x1 * sin[None, :]).to(out_ty), mask=mask)
