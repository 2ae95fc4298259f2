# HONEST: softmax in float32, the k largest, optional renormalisation.
import torch
from torch import nn


class TopKSoftmax(nn.Module):
    def __init__(self, top_k, renormalize=True):
        super().__init__()
        self.top_k, self.renormalize = top_k, renormalize

    def forward(self, gating_output):
        w, ids = torch.softmax(gating_output.float(), dim=-1).topk(self.top_k, dim=-1)
        if self.renormalize:
            w = w / w.sum(-1, keepdim=True)
        return w, ids.int()
