# NOT SHARDED: a single-GPU layer that ignores the tensor-parallel degree (the whole weight on every rank).
import torch
import torch.nn.functional as F
from torch import nn


class RowParallelLinear(nn.Module):
    def __init__(self, input_size, output_size, bias=False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(output_size, input_size))
        self.bias = nn.Parameter(torch.empty(output_size)) if bias else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)
