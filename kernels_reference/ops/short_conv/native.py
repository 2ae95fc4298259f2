"""The causal depthwise convolution in plain PyTorch: the definition the Triton kernels are held to.

Each sequence's window is its initial state (the ``K - 1`` inputs that preceded it, zeros for a
fresh sequence) followed by its own inputs; output token ``t`` is the bias plus the ``K`` taps of
the window ending at ``t``, then the activation. The sequence's new state is the last ``K - 1``
rows of that window, so a sequence shorter than ``K - 1`` keeps part of its old state (shifted).
"""
from typing import Optional

import torch
import torch.nn.functional as F

from ...dispatch import compute_dtype


def short_conv_native(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                      conv_states: torch.Tensor, query_start_loc: torch.Tensor,
                      cache_indices: Optional[torch.Tensor], has_initial_state: Optional[torch.Tensor],
                      activation: Optional[str]) -> torch.Tensor:
    """x [T, D] packed; weight [D, K]; conv_states [slots, K - 1, D], updated in place."""
    compute = compute_dtype(x.dtype)
    width = weight.shape[-1]
    starts = query_start_loc.tolist()
    n_seq = len(starts) - 1
    slots = cache_indices.tolist() if cache_indices is not None else list(range(n_seq))
    has_init = has_initial_state.tolist() if has_initial_state is not None else [False] * n_seq
    w = weight.to(compute)
    b = bias.to(compute) if bias is not None else None
    out = x.new_empty(x.shape)  # contiguous, as the kernels' output (and the compiled op's fake)
    for seq in range(n_seq):
        start, end = starts[seq], starts[seq + 1]
        slot = slots[seq]
        if has_init[seq]:
            before = conv_states[slot].to(compute)
        else:
            before = torch.zeros((width - 1, x.shape[1]), dtype=compute, device=x.device)
        window = torch.cat([before, x[start:end].to(compute)])  # [K - 1 + L, D]
        length = end - start
        acc = torch.zeros((length, x.shape[1]), dtype=compute, device=x.device)
        if b is not None:
            acc += b
        for tap in range(width):
            acc += window[tap: tap + length] * w[:, tap]
        if activation in ("silu", "swish"):
            acc = F.silu(acc)
        out[start:end] = acc.to(x.dtype)
        conv_states[slot] = window[length:].to(conv_states.dtype)
    return out
