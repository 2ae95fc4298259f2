# WRONG: each rank hands back its own partial sum (the communication skipped).
from torch import nn


class TensorParallelAllReduce(nn.Module):
    def forward(self, x):
        return x.clone()
