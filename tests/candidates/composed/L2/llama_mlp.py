# HONEST L2 candidate built on the reference L1 modules (its own forward, reference children).
# tests/test_composed.py puts the wrong L1 SiluAndMul (silu_swapped) beside it: composed mode
# must fail it, independent mode pass it.
from torch import nn

from kernels_reference.L1.linear import MergedColumnParallelLinear, RowParallelLinear
from kernels_reference.L1.silu_and_mul import SiluAndMul


class LlamaMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str = "silu", bias: bool = False):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2, bias=bias)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=bias)
        self.act_fn = SiluAndMul()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))
