"""LlamaMLP from this tree's L1 modules: gate_up_proj -> SiluAndMul (Triton) -> down_proj."""
from torch import nn

from ..L1.linear import MergedColumnParallelLinear, RowParallelLinear
from ..L1.silu_and_mul import SiluAndMul


class LlamaMLP(nn.Module):
    def __init__(self, hidden_size, intermediate_size, hidden_act="silu", bias=False):
        super().__init__()
        if hidden_act != "silu":
            raise NotImplementedError(f"hidden_act {hidden_act!r}")
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2, bias=bias)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=bias)
        self.act_fn = SiluAndMul()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))
