"""Linear layers with vLLM's names, fused weight layouts and tensor-parallel sharding.

``QKVParallelLinear`` holds q, k and v projections as one weight [(nq + 2 nk) * head_size, hidden];
``MergedColumnParallelLinear`` holds gate and up as one [2 * intermediate, hidden]. Simplification
(documented): ``forward`` returns the output tensor only, not vLLM's ``(output, output_bias)``.
The fast path is cuBLAS through ``F.linear``, which is what production calls for dense bf16 GEMMs.

Under tensor parallelism (:mod:`kernels_reference.parallel_state`, read when a layer is built) each
rank holds vLLM's shard: the column-parallel layers a slice of the output features (each merged
matrix sliced on its own; q heads split and KV heads split, or replicated when the degree exceeds
them), ``RowParallelLinear`` a slice of the input features, its partial sums all-reduced
(``reduce_results``) and its bias added once, on rank 0, before the reduction.
``ColumnParallelLinear(gather_output=True)`` all-gathers its output. ``shard_checkpoint`` cuts a
full checkpoint tensor to this rank's part, so every degree loads the same Hub files. At degree 1
every layer is the plain single-GPU layer.
"""
from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..parallel_state import (divide, get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size,
                              tensor_model_parallel_all_gather, tensor_model_parallel_all_reduce)
from ..records import RecordsInit


class ReplicatedLinear(RecordsInit, nn.Module):
    """The whole weight on every rank."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False):
        super().__init__()
        self.input_size, self.output_size = input_size, output_size
        self._allocate(output_size, input_size, bias)

    def _allocate(self, rows: int, cols: int, bias: bool) -> None:
        self.weight = nn.Parameter(torch.empty(rows, cols))
        self.bias = nn.Parameter(torch.empty(rows)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def shard_checkpoint(self, param: str, tensor: torch.Tensor, shard=None) -> torch.Tensor:
        """This rank's part of a full checkpoint tensor for ``param`` ("weight" / "bias"); ``shard``:
        which packed piece it is (q/k/v, a merged index), None for the whole parameter."""
        return tensor


class ColumnParallelLinear(ReplicatedLinear):
    """Output-sharded (DeepSeek's q_proj, q_b_proj, kv_b_proj): rank r computes output features
    [r * out / tp, (r + 1) * out / tp); ``gather_output`` all-gathers them."""

    RECORDED_WHEN_PASSED = ("gather_output",)

    def __init__(self, input_size: int, output_size: int, bias: bool = False, gather_output: bool = False):
        nn.Module.__init__(self)
        self.tp_size, self.tp_rank = get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
        self.input_size, self.output_size, self.gather_output = input_size, output_size, gather_output
        self.output_size_per_partition = divide(output_size, self.tp_size)
        self._allocate(self.output_size_per_partition, input_size, bias)

    def forward(self, x):
        return self._gathered(F.linear(x, self.weight, self.bias))

    def forward_native(self, x):
        return self._gathered(F.linear(x, self.weight, self.bias))

    def _gathered(self, out):
        return tensor_model_parallel_all_gather(out) if self.gather_output else out

    def shard_checkpoint(self, param, tensor, shard=None):
        size = self.output_size_per_partition
        return tensor.narrow(0, self.tp_rank * size, size)


class RowParallelLinear(ReplicatedLinear):
    """o_proj and down_proj: input-sharded; each rank's partial product (rank 0 adding the bias) is
    all-reduced when ``reduce_results`` (vLLM's fused all-reduce + norm passes False and reduces
    itself). ``x`` is this rank's slice of the input features (``input_is_parallel``)."""

    RECORDED_WHEN_PASSED = ("input_is_parallel", "reduce_results")

    def __init__(self, input_size: int, output_size: int, bias: bool = False, input_is_parallel: bool = True,
                 reduce_results: bool = True):
        nn.Module.__init__(self)
        self.tp_size, self.tp_rank = get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
        self.input_size, self.output_size = input_size, output_size
        self.input_is_parallel, self.reduce_results = input_is_parallel, reduce_results
        self.input_size_per_partition = divide(input_size, self.tp_size)
        self._allocate(output_size, self.input_size_per_partition, bias)

    def forward(self, x):
        return self._forward(x)

    def forward_native(self, x):
        return self._forward(x)

    def _forward(self, x):
        if not self.input_is_parallel and self.tp_size > 1:  # the whole input: take this rank's columns
            x = x.narrow(-1, self.tp_rank * self.input_size_per_partition, self.input_size_per_partition)
        out = F.linear(x, self.weight, self.bias if self.tp_rank == 0 else None)
        return tensor_model_parallel_all_reduce(out) if self.reduce_results and self.tp_size > 1 else out

    def shard_checkpoint(self, param, tensor, shard=None):
        if param == "bias":  # whole on every rank; only rank 0 adds it
            return tensor
        size = self.input_size_per_partition
        return tensor.narrow(1, self.tp_rank * size, size)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel matrices in one weight (gate and up): each is sharded on its own, so
    rank r holds [gate rows of r | up rows of r]."""

    def __init__(self, input_size: int, output_sizes: List[int], bias: bool = False, gather_output: bool = False):
        super().__init__(input_size, sum(output_sizes), bias, gather_output)
        self.total_output_sizes = list(output_sizes)
        self.output_sizes = [divide(n, self.tp_size) for n in output_sizes]  # this rank's, as laid out

    def shard_offset(self, index: int) -> int:
        return sum(self.output_sizes[:index])

    def shard_checkpoint(self, param, tensor, shard=None):
        if shard is None:  # the whole fused matrix: each piece's slice, concatenated
            pieces = tensor.split(self.total_output_sizes, dim=0)
            return torch.cat([self.shard_checkpoint(param, p, i) for i, p in enumerate(pieces)])
        size = self.output_sizes[shard]
        return tensor.narrow(0, self.tp_rank * size, size)


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v in one weight. Rank r holds heads [r * nq / tp, ...) of q and its KV heads: split
    when the degree divides the KV heads, else one KV head replicated on tp / nk ranks each (the
    degree must then be a multiple of the KV head count), as vLLM lays them out."""

    def __init__(self, hidden_size: int, head_size: int, total_num_heads: int,
                 total_num_kv_heads: Optional[int] = None, bias: bool = False):
        tp = get_tensor_model_parallel_world_size()
        kv = total_num_kv_heads or total_num_heads
        heads = divide(total_num_heads, tp)
        if tp >= kv and tp % kv:
            raise ValueError(f"tensor-parallel size {tp} exceeds the {kv} KV heads but is not a multiple of "
                             "them: the KV heads cannot be replicated evenly")
        replicas, kv_heads = (tp // kv, 1) if tp >= kv else (1, divide(kv, tp))
        super().__init__(hidden_size, (heads + 2 * kv_heads) * head_size * tp, bias)
        self.total_num_heads, self.total_num_kv_heads, self.kv_replicas = total_num_heads, kv, replicas
        self.head_size, self.num_heads, self.num_kv_heads = head_size, heads, kv_heads

    def shard_offset(self, shard: str) -> int:
        q, kv = self.num_heads * self.head_size, self.num_kv_heads * self.head_size
        return {"q": 0, "k": q, "v": q + kv}[shard]

    def shard_size(self, shard: str) -> int:
        return (self.num_heads if shard == "q" else self.num_kv_heads) * self.head_size

    def shard_checkpoint(self, param, tensor, shard=None):
        if shard is None:  # the fused [q | k | v] matrix of the whole model
            q, kv = self.total_num_heads * self.head_size, self.total_num_kv_heads * self.head_size
            pieces = dict(zip("qkv", tensor.split([q, kv, kv], dim=0)))
            return torch.cat([self.shard_checkpoint(param, pieces[s], s) for s in "qkv"])
        size = self.shard_size(shard)
        index = self.tp_rank if shard == "q" else self.tp_rank // self.kv_replicas
        return tensor.narrow(0, index * size, size)
