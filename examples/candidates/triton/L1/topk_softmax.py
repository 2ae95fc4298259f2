# An honest router gate in plain PyTorch: the k largest logits first (softmax is monotone, so they
# are the k largest probabilities), then their probabilities from one log-sum-exp over the row.
import torch
from torch import nn


class TopKSoftmax(nn.Module):
    def __init__(self, top_k, renormalize=True):
        super().__init__()
        self.top_k, self.renormalize = top_k, renormalize

    def forward(self, gating_output):
        logits = gating_output.float()
        top, ids = torch.topk(logits, self.top_k, dim=-1)
        if self.renormalize:  # a softmax over the chosen logits only
            weights = torch.softmax(top, dim=-1)
        else:
            weights = torch.exp(top - torch.logsumexp(logits, dim=-1, keepdim=True))
        return weights, ids.to(torch.int32)
