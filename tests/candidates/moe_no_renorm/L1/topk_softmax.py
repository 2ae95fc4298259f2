# WRONG: ignores renormalize (right only where the model does not renormalise).
import torch
from torch import nn


class TopKSoftmax(nn.Module):
    def __init__(self, top_k, renormalize=True):
        super().__init__()
        self.top_k, self.renormalize = top_k, renormalize

    def forward(self, gating_output):
        w, ids = torch.softmax(gating_output.float(), dim=-1).topk(self.top_k, dim=-1)
        return w, ids.int()
