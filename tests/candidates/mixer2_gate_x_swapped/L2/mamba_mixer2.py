# WRONG: reads in_proj's output as [x | z | B | C | dt] (the gate and the SSM input swapped). Every
# shape fits; every output is wrong.
import torch

from kernels_reference.L1.linear import MergedColumnParallelLinear
from kernels_reference.L2.mamba_mixer2 import MambaMixer2 as _Reference


class _SwappedProjection(MergedColumnParallelLinear):
    def forward(self, x):
        out = super().forward(x)
        w = self.output_sizes[0]
        return torch.cat([out[:, w: 2 * w], out[:, :w], out[:, 2 * w:]], dim=-1)


class MambaMixer2(_Reference):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        proj = self.in_proj
        self.in_proj = _SwappedProjection(proj.input_size, proj.output_sizes, bias=proj.bias is not None)
