# HONEST: written the ordinary way, a bare nn.Module: each sequence's rows sliced out of the
# packed batch by its length, averaged in float32, then L2 normalised.
import torch
import torch.nn.functional as F
from torch import nn


class Pooler(nn.Module):
    def __init__(self, pooling_type="MEAN", normalize=True):
        super().__init__()
        self.pooling_type, self.normalize = pooling_type, normalize

    def forward(self, hidden_states, prompt_lens):
        rows, start = [], 0
        for n in prompt_lens.tolist():
            seq = hidden_states[start:start + n].float()
            rows.append(seq.mean(0) if self.pooling_type == "MEAN" else seq[0] if self.pooling_type == "CLS" else seq[-1])
            start += n
        out = torch.stack(rows)
        return F.normalize(out, dim=-1) if self.normalize else out
