"""The tensor-parallel all-reduce, and the fused all-reduce + residual add + RMSNorm that serving
stacks run after a row-parallel layer at decode.

vLLM calls ``tensor_model_parallel_all_reduce(x)`` (NCCL, or its custom one-shot / two-shot
all-reduce over peer memory, or torch symmetric memory), and at decode fuses it with the next
layer's residual add and RMSNorm (FlashInfer's all-reduce fusion). Both are functions there; the
suite scores them as modules so a candidate can replace them:

* ``TensorParallelAllReduce()``: ``forward(x[T, H]) -> [T, H]``, the sum of every rank's ``x``,
  held by every rank. At degree 1 it returns ``x`` (a copy: outputs never alias inputs).
* ``AllReduceFusedAddRMSNorm(hidden_size, eps)``: ``forward(x, residual) -> (out, residual')``,
  ``residual' = all_reduce(x) + residual`` and ``out = rms_norm(residual') * weight`` (vLLM's
  fused-add RMSNorm after the reduction: statistics in float32, one rounding of each result).

The reference reduces with ``torch.distributed`` (gloo on the CPU, NCCL on GPUs) through
:mod:`kernels_reference.parallel_state`; the sum is taken in the activation's dtype, as NCCL does.
"""
import torch
from torch import nn

from ..dispatch import compute_dtype
from ..parallel_state import tensor_model_parallel_all_reduce
from ..records import RecordsInit


class TensorParallelAllReduce(RecordsInit, nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return tensor_model_parallel_all_reduce(x.clone())

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        return tensor_model_parallel_all_reduce(x.clone())


class AllReduceFusedAddRMSNorm(RecordsInit, nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.hidden_size, self.variance_epsilon = hidden_size, eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x: torch.Tensor, residual: torch.Tensor):
        return self.forward_native(x, residual)

    def forward_native(self, x, residual):
        reduced = tensor_model_parallel_all_reduce(x.clone())
        dt = compute_dtype(x.dtype)
        summed = reduced.to(dt) + residual.to(dt)
        variance = summed.pow(2).mean(dim=-1, keepdim=True)
        out = summed * torch.rsqrt(variance + self.variance_epsilon) * self.weight.to(dt)
        return out.to(x.dtype), summed.to(x.dtype)
