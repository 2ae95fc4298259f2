"""Dinov2MLP (HF ``Dinov2MLP``; vLLM's and HF's ``SiglipMLP`` is the same module): the MLP of a
ViT-style encoder block, ``fc2(gelu(fc1(x)))`` over a batch of images ``[B, S, D]``.

Exact GELU for DINOv2 (``hidden_act="gelu"``), tanh GELU for SigLIP (``"gelu_pytorch_tanh"``);
``fc1`` / ``fc2`` are the checkpoints' names. fc1's bias is applied inside the activation (the GEMM
then the bias + GELU epilogue, one pass over the intermediate), fc2 is a GEMM with its bias.
"""
import torch
from torch import nn

from ..L1.gelu import GELU, gelu_approximation
from ..L1.linear import ColumnParallelLinear, RowParallelLinear
from ..native import run
from ..records import RecordsInit


class Dinov2MLP(RecordsInit, nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str = "gelu"):
        super().__init__()
        self.fc1 = ColumnParallelLinear(hidden_size, intermediate_size, bias=True)
        self.act = GELU(gelu_approximation(hidden_act))
        self.fc2 = RowParallelLinear(intermediate_size, hidden_size, bias=True)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._forward(hidden_states, native=False)

    def forward_native(self, hidden_states):
        return self._forward(hidden_states, native=True)

    def _forward(self, hidden_states, native):
        # fc1's bias goes into the activation (the GEMM's bias + GELU epilogue)
        up = torch.nn.functional.linear(hidden_states, self.fc1.weight)
        return run(self.fc2, native, run(self.act, native, up, self.fc1.bias))

