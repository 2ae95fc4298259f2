# An honest short convolution in plain PyTorch, without a loop over sequences: every token finds
# its sequence with searchsorted, each of the K taps is one gather (from the packed input, or from
# the sequence's state slot where the tap reaches before the sequence's first token), and the new
# states are gathered from the same [state | inputs] window before one scatter into the pool.
import torch
import torch.nn.functional as F
from torch import nn


class ShortConvolution(nn.Module):
    def __init__(self, hidden_size, kernel_size=4, bias=False, activation="silu"):
        super().__init__()
        self.activation = activation
        self.weight = nn.Parameter(torch.empty(hidden_size, 1, kernel_size))
        self.bias = nn.Parameter(torch.zeros(hidden_size)) if bias else None

    def forward(self, x, conv_states, query_start_loc=None, cache_indices=None, has_initial_state=None):
        n = x.shape[0]
        if query_start_loc is None:  # decode: each row is a sequence continuing its state
            query_start_loc = torch.arange(n + 1, device=x.device)
            has_initial_state = torch.ones(n, dtype=torch.bool, device=x.device)
        bounds = query_start_loc.long()
        n_seq = bounds.numel() - 1
        slots = cache_indices.long() if cache_indices is not None else torch.arange(n_seq, device=x.device)
        keep = has_initial_state if has_initial_state is not None else \
            torch.zeros(n_seq, dtype=torch.bool, device=x.device)
        taps = self.weight.shape[-1]

        def window_rows(seq, pos):
            """Row ``pos`` of each sequence's window [state (K - 1 rows) | its inputs], in float32."""
            from_input = pos >= taps - 1
            src = (bounds[seq] + pos - (taps - 1)).clamp(0, max(n - 1, 0))
            row = pos.clamp(max=taps - 2)
            state = conv_states[slots[seq], row].float() * keep[seq].unsqueeze(-1)
            inp = x[src].float() if n else torch.zeros_like(state)
            return torch.where(from_input.unsqueeze(-1), inp, state)

        token = torch.arange(n, device=x.device)
        seq_of = torch.searchsorted(bounds[1:], token, right=True)
        pos_of = token - bounds[seq_of] + taps - 1  # the token's row in its window
        w = self.weight[:, 0, :].float()
        acc = self.bias.float().expand(n, -1).clone() if self.bias is not None else \
            torch.zeros(n, x.shape[1], device=x.device)
        for k in range(taps):
            acc += window_rows(seq_of, pos_of - (taps - 1 - k)) * w[:, k]
        out = (F.silu(acc) if self.activation in ("silu", "swish") else acc).to(x.dtype)

        lengths = bounds[1:] - bounds[:-1]
        seq = torch.arange(n_seq, device=x.device).repeat_interleave(taps - 1)
        pos = lengths.repeat_interleave(taps - 1) + torch.arange(taps - 1, device=x.device).repeat(n_seq)
        new_states = window_rows(seq, pos).view(n_seq, taps - 1, -1)
        conv_states[slots] = new_states.to(conv_states.dtype)
        return out
