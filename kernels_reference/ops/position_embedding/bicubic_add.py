"""DINOv2's token assembly in one launch: ``out[b, 0] = cls + pos[0]``, ``out[b, 1 + p] = x[b, p] +
bicubic(pos)[p]``, the resampled table rounded to the activation dtype before the add, as Hugging
Face's op sequence rounds it (``Dinov2PositionEmbedding.forward_fast`` is that sequence in torch).

Bicubic resampling at fixed sizes reads a 4 x 4 neighbourhood of the native table per output cell,
with weights that depend only on the sizes: ``bicubic_taps`` gives each output row and column its
four source indices (clamped to the edge) and weights, kept per (grid, height, width, device). One
program computes one output cell's resampled row (up to ``MAX_BLOCK_D`` channels) in float32 and
adds it to that cell of up to ``IMAGES_PER_PROGRAM`` images of the batch, as one 2-D tile. At
batch 1 and 224 px the op was launch-bound in torch (five launches: 27 us on the H100 where Inductor's fused version took 14,
2026-12-05, docs/perf/h100-2026-12-05.md).
"""
from __future__ import annotations

import functools
import math
from typing import Tuple

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the torch path still works without Triton
    triton = None

CUBIC_A = -0.75  # torch's (and PIL's) bicubic kernel parameter
# Images one program adds its resampled cell to, as one [images, channels] tile: its loads are
# issued together, and the cell's 16 taps are resampled once for all of them. One program per
# cell and 128 channels looping over 4 images (one image's row at a time) left 32 images of
# 336 x 448 px at 0.62 of copy bandwidth on the H100 (2026-12-06, docs/perf/h100-flashinfer-tree.md).
IMAGES_PER_PROGRAM = 8
MAX_BLOCK_D = 1024  # channels per program; wider rows (DINOv2-g's 1536) take two programs


def bicubic_taps(out_size: int, in_size: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """([out, 4] int64 source indices, [out, 4] float64 weights) of F.interpolate(mode="bicubic",
    align_corners=False, size=...) along one axis. torch's definition: the source position of
    output i is (i + 0.5) * in / out - 0.5 (not clamped for cubic), its neighbours floor - 1 ..
    floor + 2 are clamped to the edge, and the weights are Keys' cubic with A = -0.75."""
    def near(x):  # |x| <= 1
        return ((CUBIC_A + 2) * x - (CUBIC_A + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((CUBIC_A * x - 5 * CUBIC_A) * x + 8 * CUBIC_A) * x - 4 * CUBIC_A

    index = torch.zeros((out_size, 4), dtype=torch.int64)
    weight = torch.zeros((out_size, 4), dtype=torch.float64)
    scale = in_size / out_size
    for i in range(out_size):
        src = (i + 0.5) * scale - 0.5
        base = math.floor(src)
        t = src - base
        for k, (offset, w) in enumerate(zip((-1, 0, 1, 2), (far(t + 1), near(t), near(1 - t), far(2 - t)))):
            index[i, k] = min(max(base + offset, 0), in_size - 1)
            weight[i, k] = w
    return index, weight


@functools.lru_cache(maxsize=32)
def _device_taps(grid: int, height: int, width: int, device: torch.device):
    """Row and column taps of a grid x grid table resampled to height x width, on ``device``:
    int32 indices and float32 weights (sizes only, never a parameter)."""
    rows, cols = bicubic_taps(height, grid), bicubic_taps(width, grid)
    return tuple(t.to(device=device, dtype=torch.int32 if t.dtype == torch.int64 else torch.float32)
                 for t in (*rows, *cols))


if triton is not None:
    @triton.jit
    def _bicubic_add_kernel(x_ptr, pos_ptr, cls_ptr, out_ptr, row_idx_ptr, row_w_ptr, col_idx_ptr, col_w_ptr,
                            batch, width, grid, dim, x_stride_b, x_stride_p, out_stride_b, out_stride_p,
                            BLOCK_D: tl.constexpr, IMAGES: tl.constexpr):
        cell = tl.program_id(0)  # output token: 0 the class token, 1 + i * width + j the patches
        offs = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        images = tl.program_id(2) * IMAGES + tl.arange(0, IMAGES)
        mask = offs < dim
        tile_mask = (images < batch)[:, None] & mask[None, :]
        out_rows = out_ptr + images[:, None].to(tl.int64) * out_stride_b + offs[None, :]
        out_ty = out_ptr.dtype.element_ty
        if cell == 0:
            table = tl.load(pos_ptr + offs, mask=mask, other=0.0).to(tl.float32).to(out_ty).to(tl.float32)
            cls = tl.load(cls_ptr + offs, mask=mask, other=0.0).to(out_ty).to(tl.float32)
            value = tl.zeros((IMAGES, BLOCK_D), dtype=tl.float32) + (cls + table)[None, :]
            tl.store(out_rows, value.to(out_ty), mask=tile_mask)
        else:
            q = cell - 1
            i = q // width
            j = q - i * width
            # The images' loads first: they do not depend on the resampling below.
            x = tl.load(x_ptr + images[:, None].to(tl.int64) * x_stride_b + q * x_stride_p + offs[None, :],
                        mask=tile_mask, other=0.0).to(tl.float32)
            acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
            for a in tl.static_range(4):
                r = tl.load(row_idx_ptr + i * 4 + a)
                wr = tl.load(row_w_ptr + i * 4 + a)
                for c in tl.static_range(4):
                    col = tl.load(col_idx_ptr + j * 4 + c)
                    wc = tl.load(col_w_ptr + j * 4 + c)
                    src = pos_ptr + (1 + r * grid + col) * dim + offs
                    acc += (wr * wc) * tl.load(src, mask=mask, other=0.0).to(tl.float32)
            table = acc.to(out_ty).to(tl.float32)
            tl.store(out_rows + cell * out_stride_p, (x + table[None, :]).to(out_ty), mask=tile_mask)


def bicubic_add(embeddings: torch.Tensor, position_embeddings: torch.Tensor, cls_token: torch.Tensor,
                grid: int, height: int, width: int) -> torch.Tensor:
    """``embeddings`` [B, h * w, D] (unit channel stride), ``position_embeddings`` [1, 1 + g * g, D],
    ``cls_token`` [1, 1, D] -> [B, 1 + h * w, D] in the embeddings' dtype."""
    if triton is None:
        raise RuntimeError("bicubic_add needs Triton")
    batch, patches, dim = embeddings.shape
    if patches != height * width:
        raise ValueError(f"{patches} patch tokens for a {height} x {width} grid")
    if embeddings.stride(-1) != 1:
        embeddings = embeddings.contiguous()
    pos = position_embeddings.reshape(-1, dim).contiguous()
    cls = cls_token.reshape(dim).contiguous()
    out = torch.empty((batch, 1 + patches, dim), dtype=embeddings.dtype, device=embeddings.device)
    if batch == 0:
        return out
    row_idx, row_w, col_idx, col_w = _device_taps(grid, height, width, embeddings.device)
    block = min(MAX_BLOCK_D, triton.next_power_of_2(dim))
    images = min(IMAGES_PER_PROGRAM, triton.next_power_of_2(batch))
    grid_launch = (1 + patches, triton.cdiv(dim, block), triton.cdiv(batch, images))
    _bicubic_add_kernel[grid_launch](
        embeddings, pos, cls, out, row_idx, row_w, col_idx, col_w, batch, width, grid, dim,
        embeddings.stride(0), embeddings.stride(1), out.stride(0), out.stride(1), BLOCK_D=block,
        IMAGES=images, num_warps=4 if images * block >= 2048 else 2)
    return out
