"""Dinov2MLP (SigLIP's MLP too) from this tree's modules: fc1's GEMM without its bias, the bias added
inside this tree's GELU kernel, then fc2 with its bias."""
import torch
from torch import nn

from ..L1.gelu import GELU
from ..L1.linear import ReplicatedLinear, RowParallelLinear


class Dinov2MLP(nn.Module):
    def __init__(self, hidden_size, intermediate_size, hidden_act="gelu"):
        super().__init__()
        self.fc1 = ReplicatedLinear(hidden_size, intermediate_size, bias=True)
        self.act = GELU("tanh" if hidden_act == "gelu_pytorch_tanh" else "none")
        self.fc2 = RowParallelLinear(intermediate_size, hidden_size, bias=True)

    def forward(self, hidden_states):
        up = torch.matmul(hidden_states, self.fc1.weight.t())
        return self.fc2(self.act(up, self.fc1.bias))
