"""Linear layers in plain PyTorch: a dense GEMM is the vendor BLAS's job (cuBLAS on the GPU).

The fused layers keep the reference's weight layouts: QKV rows are [q heads | k heads | v heads],
gate/up rows are [gate | up]. ``forward`` returns the output only (the suite's convention).
"""
import torch
from torch import nn

from kernels_reference.parallel_state import (get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size,
                                              tensor_model_parallel_all_reduce)


def _project(x, weight, bias):
    """x [..., in] @ weight.T (+ bias), flattened to 2-D so strided rows go to one GEMM call."""
    rows = x.reshape(-1, x.shape[-1])
    if bias is None:
        out = torch.mm(rows, weight.t())
    else:
        out = torch.addmm(bias, rows, weight.t())
    return out.view(*x.shape[:-1], weight.shape[0])


class ReplicatedLinear(nn.Module):
    def __init__(self, input_size, output_size, bias=False):
        super().__init__()
        self.input_size, self.output_size = input_size, output_size
        self.weight = nn.Parameter(torch.empty(output_size, input_size))
        self.bias = nn.Parameter(torch.empty(output_size)) if bias else None

    def forward(self, x):
        return _project(x, self.weight, self.bias)


class RowParallelLinear(ReplicatedLinear):
    """o_proj / down_proj. Under tensor parallelism (the serving framework's parallel state, read
    when built) each rank holds its slice of the input features, adds the bias on rank 0 only and
    sums the partial products over the ranks; on one GPU, a plain projection."""

    def __init__(self, input_size, output_size, bias=False, input_is_parallel=True, reduce_results=True):
        self.tp_size, self.tp_rank = get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
        super().__init__(input_size // self.tp_size, output_size, bias)
        self.input_size, self.reduce_results = input_size, reduce_results

    def forward(self, x):
        out = _project(x, self.weight, self.bias if self.tp_rank == 0 else None)
        return tensor_model_parallel_all_reduce(out) if self.reduce_results and self.tp_size > 1 else out


class MergedColumnParallelLinear(ReplicatedLinear):
    """[gate | up]; under tensor parallelism this rank's rows of each: [gate_r | up_r]."""

    def __init__(self, input_size, output_sizes, bias=False):
        tp = get_tensor_model_parallel_world_size()
        super().__init__(input_size, sum(output_sizes) // tp, bias)
        self.output_sizes = [n // tp for n in output_sizes]


class QKVParallelLinear(ReplicatedLinear):
    """[q | k | v]; under tensor parallelism this rank's q heads and its KV heads (one KV head
    per rank, shared by tp / KV-heads ranks, when the degree exceeds the KV heads)."""

    def __init__(self, hidden_size, head_size, total_num_heads, total_num_kv_heads=None, bias=False):
        tp = get_tensor_model_parallel_world_size()
        kv_heads = total_num_kv_heads or total_num_heads
        heads, kv_heads = total_num_heads // tp, max(kv_heads // tp, 1)
        super().__init__(hidden_size, (heads + 2 * kv_heads) * head_size, bias)
        self.head_size, self.num_heads, self.num_kv_heads = head_size, heads, kv_heads
