"""2-D rotary position embedding of DINOv3's vision transformers, applied to q and k of the patch tokens.

DINOv3 has no position table: each patch token's query and key are rotated by angles taken from the
patch's place on the image grid, and the prefix tokens (the class token and the register tokens,
which come first in the sequence) are not rotated at all. Hugging Face splits this into
``DINOv3ViTRopePositionEmbedding`` (the model computes cos/sin once per image size) and
``apply_rotary_pos_emb`` (every layer's attention rotates its q/k); timm's ``RotaryEmbeddingDinoV3``
is the same split. Here one module does both, as vLLM's ``RotaryEmbedding`` does for text: the
layer's attention calls ``forward(query, key, grid_height, grid_width) -> (query, key)`` right after
its qkv projection, so the kernel sees what production's rotation sees (strided column slices of the
fused qkv output) and the table is an implementation detail of the module, cached per grid.

Shapes: ``query`` / ``key`` are ``[B, S, heads * head_size]`` (the layer's column views) or
``[B, S, heads, head_size]``, with ``S = num_prefix_tokens + grid_height * grid_width`` and the
patches row by row (patch ``(i, j)`` is token ``num_prefix_tokens + i * grid_width + j``, the order
of ``PatchEmbed``). Another ``S`` is refused.

Semantics (``forward_native``), as Hugging Face's model computes them at inference (its random
shift / jitter / rescale of the coordinates are training augmentations, off in ``eval``):

* patch centres on ``[-1, 1]``, each axis divided by its own patch count (DINOv3's "separate"
  normalisation): ``y_i = (i + 0.5) / grid_height * 2 - 1``, ``x_j = (j + 0.5) / grid_width * 2 - 1``;
* ``head_size / 4`` frequencies ``f_m = base ** (-4 m / head_size)`` (``base`` = ``rope_theta``,
  100 for every DINOv3 model), the same for both axes;
* angles ``2 pi * y * f`` for the first quarter of the head's features and ``2 pi * x * f`` for the
  second; the rotation pairs feature ``c`` with feature ``c + head_size / 2`` (Neox style, HF's
  ``rotate_half`` with cos/sin tiled twice), so features ``[0, d/4)`` and ``[d/2, 3d/4)`` turn
  with the row, ``[d/4, d/2)`` and ``[3d/4, d)`` with the column.

Numerics: angles, cos/sin and the rotation in float32 for half types (float64 stays float64: the
correctness truth), one rounding to the input dtype; prefix tokens pass through bit for bit. Hugging
Face computes the angles in float32 for every dtype and then rounds cos/sin to the activation dtype
before a bf16 rotation; this module keeps them in float32, a more accurate reference.

Fast path (CUDA): one Triton launch rotates the patch tokens of q and k in place (the prefix rows
are never touched) from a float32 cos/sin table of the grid, built by the native code once per grid
and device and kept (a few hundred KB at 512 px): the table costs nothing per layer and holds the
exact float32 values of the native path. Triton rather than a torch fast path because the rotation
is a pure memory-bound elementwise pass; torch would read and write each tensor several times
(halves, products, cat) and could not work in place on the qkv views. Inputs whose feature stride
is not one are rotated in a contiguous copy. The native path returns new tensors; callers must not
rely on either behaviour.
"""
import math
from collections import OrderedDict
from typing import Tuple

import torch
from torch import nn

from ..dispatch import compute_dtype, use_fast_path
from ..records import RecordsInit

try:
    import triton
    import triton.language as tl
except ImportError:  # the native path still works without Triton
    triton = None

_CACHED_GRIDS = 32  # cos/sin tables kept per module (as Hugging Face caches its coordinates)


class DINOv3ViTRopePositionEmbedding(RecordsInit, nn.Module):
    def __init__(self, head_size: int, base: float = 100.0, num_prefix_tokens: int = 1):
        super().__init__()
        if head_size % 4:
            raise ValueError(f"head_size={head_size} must be a multiple of 4 (two axes, pairs of features)")
        if num_prefix_tokens < 0:
            raise ValueError(f"num_prefix_tokens={num_prefix_tokens} must be >= 0")
        self.head_size, self.base, self.num_prefix_tokens = head_size, float(base), num_prefix_tokens
        self._tables = OrderedDict()  # (grid_height, grid_width, device) -> float32 [N, head_size] cos | sin

    # ---- angles -------------------------------------------------------------------------------
    def inv_freq(self, dtype: torch.dtype, device=None) -> torch.Tensor:
        """The ``head_size / 4`` frequencies of each axis, ``base ** (-4 m / head_size)``."""
        exponents = torch.arange(self.head_size // 4, dtype=dtype, device=device) * (4.0 / self.head_size)
        return 1.0 / (self.base ** exponents)

    @staticmethod
    def patch_centres(grid_height: int, grid_width: int, dtype: torch.dtype, device=None) -> torch.Tensor:
        """[N, 2]: the (y, x) centre of every patch, row by row, each axis on [-1, 1]."""
        ys = (torch.arange(grid_height, dtype=dtype, device=device) + 0.5) / grid_height
        xs = (torch.arange(grid_width, dtype=dtype, device=device) + 0.5) / grid_width
        y = (2.0 * ys - 1.0)[:, None].expand(grid_height, grid_width)
        x = (2.0 * xs - 1.0)[None, :].expand(grid_height, grid_width)
        return torch.stack([y, x], dim=-1).reshape(grid_height * grid_width, 2)

    def cos_sin(self, grid_height: int, grid_width: int, dtype: torch.dtype, device=None
                ) -> Tuple[torch.Tensor, torch.Tensor]:
        """cos and sin, each [N, head_size / 2]: the row's angles, then the column's."""
        centres = self.patch_centres(grid_height, grid_width, dtype, device)
        angles = (2 * math.pi * centres)[:, :, None] * self.inv_freq(dtype, device)[None, None, :]
        angles = angles.flatten(1)
        return angles.cos(), angles.sin()

    def cos_sin_table(self, grid_height: int, grid_width: int, device) -> torch.Tensor:
        """[N, head_size] float32 (cos half, then sin half) for the fast path, kept per grid."""
        key = (grid_height, grid_width, str(device))
        if key in self._tables:
            self._tables.move_to_end(key)
        else:
            cos, sin = self.cos_sin(grid_height, grid_width, torch.float32, device)
            self._tables[key] = torch.cat([cos, sin], dim=-1).contiguous()
            if len(self._tables) > _CACHED_GRIDS:
                self._tables.popitem(last=False)
        return self._tables[key]

    # ---- forward ------------------------------------------------------------------------------
    def forward(self, query: torch.Tensor, key: torch.Tensor, grid_height: int, grid_width: int):
        if triton is not None and use_fast_path(query, key):
            return self.forward_triton(query, key, grid_height, grid_width)
        return self.forward_native(query, key, grid_height, grid_width)

    def forward_native(self, query, key, grid_height, grid_width):
        compute = compute_dtype(query.dtype)
        cos, sin = self.cos_sin(grid_height, grid_width, compute, query.device)
        return (self._rotate_native(query, cos, sin, grid_height, grid_width),
                self._rotate_native(key, cos, sin, grid_height, grid_width))

    def _rotate_native(self, x, cos, sin, grid_height, grid_width):
        heads = self.heads_view(x, grid_height, grid_width)
        prefix, patches = heads[:, : self.num_prefix_tokens], heads[:, self.num_prefix_tokens:]
        x1, x2 = patches.to(cos.dtype).chunk(2, dim=-1)
        cos, sin = cos[None, :, None, :], sin[None, :, None, :]
        rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
        return torch.cat([prefix, rotated], dim=1).reshape(x.shape)

    def heads_view(self, x: torch.Tensor, grid_height: int, grid_width: int) -> torch.Tensor:
        """``x`` as [B, S, heads, head_size] (a view), after checking that S is the prefix plus the grid."""
        packed_heads = x.dim() == 3 and x.shape[-1] % self.head_size == 0
        if not (packed_heads or x.dim() == 4 and x.shape[-1] == self.head_size):
            raise ValueError(f"expected [B, S, heads * {self.head_size}] or [B, S, heads, {self.head_size}], "
                             f"got {tuple(x.shape)}")
        expected = self.num_prefix_tokens + grid_height * grid_width
        if x.shape[1] != expected:
            raise ValueError(f"{x.shape[1]} tokens for a {grid_height} x {grid_width} grid; expected "
                             f"{self.num_prefix_tokens} prefix + {grid_height * grid_width} patch tokens = {expected}")
        return x if x.dim() == 4 else x.unflatten(-1, (-1, self.head_size))

    def forward_triton(self, query, key, grid_height, grid_width):
        if query.dtype != key.dtype:
            raise ValueError(f"query and key must share a dtype, got {query.dtype} and {key.dtype}")
        q_heads = _unit_stride_heads(self.heads_view(query, grid_height, grid_width))
        k_heads = _unit_stride_heads(self.heads_view(key, grid_height, grid_width))
        n_patches = grid_height * grid_width
        if query.shape[0] and n_patches:
            table = self.cos_sin_table(grid_height, grid_width, query.device)
            _launch(q_heads, k_heads, table, self.num_prefix_tokens, n_patches, self.head_size // 2)
        # In place where the heads were views of the inputs; copies come back in the inputs' shapes.
        return _in_shape_of(query, q_heads), _in_shape_of(key, k_heads)

    def extra_repr(self) -> str:
        return f"head_size={self.head_size}, base={self.base}, num_prefix_tokens={self.num_prefix_tokens}"


def _unit_stride_heads(heads: torch.Tensor) -> torch.Tensor:
    return heads if heads.stride(-1) == 1 else heads.contiguous()


def _in_shape_of(x: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
    same = x.untyped_storage().data_ptr() == heads.untyped_storage().data_ptr()
    return x if same else heads.reshape(x.shape)


def _launch(q: torch.Tensor, k: torch.Tensor, table: torch.Tensor, num_prefix: int, n_patches: int, half: int):
    """Rotate the patch rows of q and k ([B, S, heads, d], unit feature stride) in place."""
    n_rows = q.shape[0] * n_patches
    nq, nk = q.shape[2], k.shape[2]
    heads_block = min(32, triton.next_power_of_2(nq + nk))
    half_block = triton.next_power_of_2(half)
    # About 1K elements a program on the GPU (one patch row of ViT-L's 16 + 16 heads of 32 pairs);
    # the interpreter pays per program, so it takes many rows at once.
    elements = 1024 if q.is_cuda else 1 << 14
    rows_block = max(1, min(elements // (heads_block * half_block), triton.next_power_of_2(n_rows)))
    grid = (triton.cdiv(n_rows, rows_block), triton.cdiv(nq + nk, heads_block))
    _rope_2d_kernel[grid](
        q, k, table, q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        n_rows, n_patches, num_prefix, nq, nq + nk, half,
        ROWS=rows_block, HEADS=heads_block, HALF=half_block, num_warps=4)


if triton is not None:

    @triton.jit
    def _rope_2d_kernel(
        q_ptr, k_ptr, table_ptr,
        q_batch_stride, q_token_stride, q_head_stride, k_batch_stride, k_token_stride, k_head_stride,
        n_rows, n_patches, num_prefix, n_q_heads, n_heads, half,
        ROWS: tl.constexpr, HEADS: tl.constexpr, HALF: tl.constexpr,
    ):
        # A [ROWS, HEADS, HALF] tile: ROWS patch tokens (flat over images), HEADS of the q heads
        # followed by the k heads, the HALF feature pairs (c, c + half) of each head.
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        row_ok = rows < n_rows
        rows = tl.where(row_ok, rows, 0).to(tl.int64)
        image = rows // n_patches
        patch = rows % n_patches
        token = num_prefix + patch
        heads = tl.program_id(1) * HEADS + tl.arange(0, HEADS)
        pairs = tl.arange(0, HALF)
        pair_ok = pairs < half

        table_at = table_ptr + patch[:, None] * (2 * half) + pairs[None, :]
        table_ok = row_ok[:, None] & pair_ok[None, :]
        cos = tl.load(table_at, mask=table_ok, other=0.0)[:, None, :]
        sin = tl.load(table_at + half, mask=table_ok, other=0.0)[:, None, :]

        is_q = (heads < n_q_heads)[None, :]
        q_rows = q_ptr + image[:, None] * q_batch_stride + token[:, None] * q_token_stride
        k_rows = k_ptr + image[:, None] * k_batch_stride + token[:, None] * k_token_stride
        head_at = tl.where(is_q, q_rows + heads[None, :] * q_head_stride,
                           k_rows + (heads[None, :] - n_q_heads) * k_head_stride)
        mask = row_ok[:, None, None] & (heads < n_heads)[None, :, None] & pair_ok[None, None, :]
        first = head_at[:, :, None] + pairs[None, None, :]
        x1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(first + half, mask=mask, other=0.0).to(tl.float32)
        out_ty = q_ptr.dtype.element_ty
        tl.store(first, (x1 * cos - x2 * sin).to(out_ty), mask=mask)
        tl.store(first + half, (x2 * cos + x1 * sin).to(out_ty), mask=mask)
