# WRONG: the decode step computes its output from the state and the new token but never shifts the
# state, so the next step would convolve stale inputs. Prefill is right.
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
        w = self.weight[:, 0, :].float()
        out = torch.empty_like(x)
        for i in range(len(starts) - 1):
            slot = int(cache_indices[i]) if cache_indices is not None else i
            kept = has_initial_state is not None and bool(has_initial_state[i])
            old = conv_states[slot].float() if kept else torch.zeros(k - 1, x.shape[1])
            window = torch.cat([old, x[starts[i]:starts[i + 1]].float()])
            acc = sum(window[j: j + window.shape[0] - k + 1] * w[:, j] for j in range(k))
            if self.bias is not None:
                acc = acc + self.bias.float()
            out[starts[i]:starts[i + 1]] = F.silu(acc).to(x.dtype)
            if not decode:  # the bug: decode leaves the state as it was
                conv_states[slot] = window[-(k - 1):].to(conv_states.dtype)
        return out
