"""How the gated delta rule's kernels address their inputs.

Production hands the op views: q, k and v are slices of the short convolution's output (one fused
[T, 2 * key_dim + value_dim] buffer), so a token's heads are not packed next to the next token's.
The kernels therefore take a token stride and a head stride per tensor instead of copying; only
the innermost dimension must be contiguous.
"""
from typing import NamedTuple

import torch


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
