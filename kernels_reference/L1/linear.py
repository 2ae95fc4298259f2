"""Linear layers with vLLM's names and fused weight layouts (single-GPU semantics).

``QKVParallelLinear`` holds q, k and v projections as one weight [(nq + 2 nk) * head_size, hidden];
``MergedColumnParallelLinear`` holds gate and up as one [2 * intermediate, hidden]. Simplification
(documented): ``forward`` returns the output tensor only, not vLLM's ``(output, output_bias)``.
The fast path is cuBLAS through ``F.linear``, which is what production calls for dense bf16 GEMMs.
"""
from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import nn
from ..records import RecordsInit


class ReplicatedLinear(RecordsInit, nn.Module):
    def __init__(self, input_size: int, output_size: int, bias: bool = False):
        super().__init__()
        self.input_size, self.output_size = input_size, output_size
        self.weight = nn.Parameter(torch.empty(output_size, input_size))
        self.bias = nn.Parameter(torch.empty(output_size)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(ReplicatedLinear):
    """o_proj and down_proj. On one GPU: a plain linear layer."""


class ColumnParallelLinear(ReplicatedLinear):
    """Output-sharded under tensor parallelism (DeepSeek's q_proj, q_b_proj, kv_b_proj). On one
    GPU: a plain linear layer."""


class MergedColumnParallelLinear(ReplicatedLinear):
    def __init__(self, input_size: int, output_sizes: List[int], bias: bool = False):
        super().__init__(input_size, sum(output_sizes), bias)
        self.output_sizes = list(output_sizes)

    def shard_offset(self, index: int) -> int:
        return sum(self.output_sizes[:index])


class QKVParallelLinear(ReplicatedLinear):
    def __init__(self, hidden_size: int, head_size: int, total_num_heads: int,
                 total_num_kv_heads: Optional[int] = None, bias: bool = False):
        kv = total_num_kv_heads or total_num_heads
        super().__init__(hidden_size, (total_num_heads + 2 * kv) * head_size, bias)
        self.head_size, self.num_heads, self.num_kv_heads = head_size, total_num_heads, kv

    def shard_offset(self, shard: str) -> int:
        q, kv = self.num_heads * self.head_size, self.num_kv_heads * self.head_size
        return {"q": 0, "k": q, "v": q + kv}[shard]

    def shard_size(self, shard: str) -> int:
        return (self.num_heads if shard == "q" else self.num_kv_heads) * self.head_size
