"""LlamaMLP (vLLM): gate_up_proj -> SiluAndMul -> down_proj."""
import torch
from torch import nn

from ..L1.linear import MergedColumnParallelLinear, RowParallelLinear
from ..L1.silu_and_mul import SiluAndMul
from ..native import run
from ..records import RecordsInit


class LlamaMLP(RecordsInit, nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str = "silu", bias: bool = False):
        super().__init__()
        if hidden_act != "silu":
            raise NotImplementedError(f"hidden_act {hidden_act!r}: only silu is supported")
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2, bias=bias)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=bias)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._forward(x, native=False)

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        return self._forward(x, native=True)

    def _forward(self, x, native):
        return run(self.down_proj, native, run(self.act_fn, native, run(self.gate_up_proj, native, x)))
