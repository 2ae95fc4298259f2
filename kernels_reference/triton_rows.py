"""Describe the rows of a tensor's last dimension to a Triton kernel without copying.

Production feeds row-wise kernels strided views: Qwen3 normalises q and k per head on views of the
fused qkv projection ([T, heads, head_dim] with a row stride of the whole qkv width). A kernel that
assumed packed rows would read the wrong memory, so row offsets are computed from two strides:
row r starts at (r // n_inner) * stride_outer + (r % n_inner) * stride_inner.
"""
from typing import NamedTuple

import torch


class RowLayout(NamedTuple):
    tensor: torch.Tensor  # the (possibly made contiguous) tensor the offsets refer to
    n_rows: int
    n_inner: int
    stride_outer: int
    stride_inner: int


def row_layout(x: torch.Tensor) -> RowLayout:
    if x.dim() == 0:
        raise ValueError("expected a tensor with at least one dimension")
    if x.stride(-1) != 1:
        x = x.contiguous()
    width = x.shape[-1]
    if x.dim() == 1:
        return RowLayout(x, 1, 1, 0, 0)
    n_rows = x.numel() // width if width else 0
    try:
        flat = x.view(-1, width)
        return RowLayout(x, n_rows, 1, flat.stride(0), 0)
    except RuntimeError:
        pass
    try:
        three = x.view(-1, x.shape[-2], width)
        return RowLayout(x, n_rows, three.shape[1], three.stride(0), three.stride(1))
    except RuntimeError:
        x = x.contiguous()
        return RowLayout(x, n_rows, 1, width, 0)


def warps_for(block: int) -> int:
    return 1 if block <= 256 else 2 if block <= 1024 else 4 if block <= 4096 else 8
