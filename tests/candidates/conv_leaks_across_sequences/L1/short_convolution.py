# WRONG: one causal convolution over the whole packed batch: each sequence's first K - 1 tokens see
# the previous sequence's last inputs instead of their own state (or zeros). Only the first
# sequence's state is used; the states written back are right.
import torch
import torch.nn.functional as F
from torch import nn


class ShortConvolution(nn.Module):
    def __init__(self, hidden_size, kernel_size=4, bias=False, activation="silu"):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(hidden_size, 1, kernel_size))
        self.bias = nn.Parameter(torch.zeros(hidden_size)) if bias else None

    def forward(self, x, conv_states, query_start_loc=None, cache_indices=None, has_initial_state=None):
        decode = query_start_loc is None
        if decode:
            query_start_loc = torch.arange(x.shape[0] + 1)
            has_initial_state = torch.ones(x.shape[0], dtype=torch.bool)
        starts = query_start_loc.tolist()
        k = self.weight.shape[-1]
        slots = [int(s) for s in cache_indices] if cache_indices is not None else list(range(len(starts) - 1))
        flags = [bool(f) for f in has_initial_state] if has_initial_state is not None else [False] * len(slots)
        old = [conv_states[s].float() if f else torch.zeros(k - 1, x.shape[1]) for s, f in zip(slots, flags)]
        if decode:  # one token per row: the windows are the states, nothing to leak
            window = torch.cat([torch.stack(old), x.float()[:, None]], 1)
            acc = (window * self.weight[:, 0, :].float().T).sum(1)
        else:
            padded = torch.cat([old[0], x.float()])  # the bug: no boundary between sequences
            w = self.weight[:, 0, :].float()
            acc = sum(padded[j: j + x.shape[0]] * w[:, j] for j in range(k))
        if self.bias is not None:
            acc = acc + self.bias.float()
        for i, slot in enumerate(slots):
            conv_states[slot] = torch.cat([old[i], x[starts[i]:starts[i + 1]].float()])[-(k - 1):].to(conv_states.dtype)
        return F.silu(acc).to(x.dtype)
