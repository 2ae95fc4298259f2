# WRONG: sharded like the reference, but the partial products are never summed over the ranks.
import torch.nn.functional as F

from kernels_reference.L1.linear import RowParallelLinear as _Ref


class RowParallelLinear(_Ref):
    def forward(self, x):
        return F.linear(x, self.weight, self.bias if self.tp_rank == 0 else None)
