"""The causal depthwise convolution in plain PyTorch: the definition the Triton kernels are held to.

Each sequence's window is its initial state (the ``K - 1`` inputs that preceded it, zeros for a
fresh sequence) followed by its own inputs; output token ``t`` is the bias plus the ``K`` taps of
the window ending at ``t``, then the activation. The sequence's new state is the last ``K - 1``
rows of that window, so a sequence shorter than ``K - 1`` keeps part of its old state (shifted).

All sequences at once, with no host synchronisation: every window row is an index into one table,
the sequences' starting states stacked above the packed tokens. So the eager form is a handful of
launches whatever the batch, CUDA graphs can hold it and ``torch.compile`` traces it whole (a loop
over sequences read their bounds on the host, and Inductor recompiled it for each length).
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
    tokens, dim = x.shape
    width = weight.shape[-1]
    n_seq = query_start_loc.numel() - 1
    device = x.device
    starts = query_start_loc[:-1].long()
    lengths = query_start_loc[1:].long() - starts
    slots = cache_indices.long() if cache_indices is not None else torch.arange(n_seq, device=device)
    before = conv_states.index_select(0, slots).to(compute)  # [B, K - 1, D]
    if has_initial_state is None:
        before = torch.zeros_like(before)
    else:  # where, not a product: a fresh sequence's slot may hold anything, NaN included
        before = torch.where(has_initial_state.view(-1, 1, 1), before, 0.0)
    # The table: B (K - 1) state rows, then the T tokens. Window row w of sequence s is state row
    # s (K - 1) + w while w < K - 1, else token starts[s] + w - (K - 1).
    table = torch.cat([before.reshape(-1, dim), x.to(compute)])
    held = n_seq * (width - 1)

    def rows(seq, start, w):
        return torch.where(w < width - 1, seq * (width - 1) + w, held + start + w - (width - 1))

    token = torch.arange(tokens, device=device)
    seq = torch.searchsorted(query_start_loc[1:].long(), token, right=True)
    start = starts[seq]
    acc = torch.zeros((tokens, dim), dtype=compute, device=device)
    if bias is not None:
        acc += bias.to(compute)
    w = weight.to(compute)
    for tap in range(width):  # token t's tap reads window row (t - start) + tap
        acc += table[rows(seq, start, token - start + tap)] * w[:, tap]
    if activation in ("silu", "swish"):
        acc = F.silu(acc)
    # The new state: window rows L .. L + K - 2 of each sequence of L tokens.
    every = torch.arange(n_seq, device=device)[:, None]
    kept = rows(every, starts[:, None], lengths[:, None] + torch.arange(width - 1, device=device))
    conv_states.index_copy_(0, slots, table[kept].to(conv_states.dtype))
    return acc.to(x.dtype)
