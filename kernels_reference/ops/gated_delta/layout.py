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


def interpreting() -> bool:
    from ...triton_rows import interpreting as _interpreting
    return _interpreting()
