"""Tensor-parallel state with vLLM's interface: the degree, this process's rank, and the collectives
the sharded layers call.

``get_tensor_model_parallel_world_size()`` / ``get_tensor_model_parallel_rank()`` are what the
reference's linear and embedding layers read when they are built (so a model built inside
:func:`tensor_parallel` allocates its rank's shard), and ``tensor_model_parallel_all_reduce`` /
``tensor_model_parallel_all_gather`` what they call in ``forward``. Outside any group the degree is
1, the rank 0 and both collectives return their input: every layer is then exactly the single-GPU
layer it always was.

A group is entered with :func:`tensor_parallel` (a ``torch.distributed`` process group the caller
made: NCCL on GPUs, gloo on the CPU; or ``None`` for the default group) or, as vLLM's
``initialize_model_parallel`` does, for the rest of the process with :func:`initialize_model_parallel`.
Shapes follow vLLM: :func:`divide` refuses a degree that does not divide what it shards.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator, Optional

import torch


@dataclasses.dataclass(frozen=True)
class TensorParallelGroup:
    world_size: int = 1
    rank: int = 0
    group: Optional[object] = None  # a torch.distributed ProcessGroup; None = the default group

    def __post_init__(self):
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"tensor-parallel rank {self.rank} of world size {self.world_size} is not a valid rank")


_STATE = TensorParallelGroup()


def get_tensor_model_parallel_world_size() -> int:
    return _STATE.world_size


def get_tensor_model_parallel_rank() -> int:
    return _STATE.rank


def get_tp_group() -> TensorParallelGroup:
    return _STATE


@contextlib.contextmanager
def tensor_parallel(world_size: int, rank: int, group=None) -> Iterator[TensorParallelGroup]:
    """Layers built and run inside see ``world_size`` / ``rank``; the previous state comes back after."""
    global _STATE
    previous, _STATE = _STATE, TensorParallelGroup(world_size, rank, group)
    try:
        yield _STATE
    finally:
        _STATE = previous


def initialize_model_parallel(tensor_model_parallel_size: Optional[int] = None, group=None) -> TensorParallelGroup:
    """The whole (initialised) ``torch.distributed`` world, or ``group``, as the tensor-parallel group
    from now on, as vLLM's function of this name sets it up for one node."""
    import torch.distributed as dist

    global _STATE
    if not dist.is_initialized():
        raise RuntimeError("initialize_model_parallel needs torch.distributed.init_process_group first")
    size = dist.get_world_size(group)
    if tensor_model_parallel_size not in (None, size):
        raise ValueError(f"tensor_model_parallel_size {tensor_model_parallel_size} must equal the group's size "
                         f"{size} (one tensor-parallel group per node, as vLLM serves one model)")
    _STATE = TensorParallelGroup(size, dist.get_rank(group), group)
    return _STATE


def destroy_model_parallel() -> None:
    global _STATE
    _STATE = TensorParallelGroup()


def divide(numerator: int, denominator: int) -> int:
    """``numerator / denominator`` when it divides exactly, else a ValueError saying what does not."""
    if numerator % denominator:
        raise ValueError(f"{numerator} is not divisible by the tensor-parallel size {denominator}")
    return numerator // denominator


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """The sum of ``x`` over the ranks (every rank gets it). May reduce in place: callers hand over
    a tensor they own (a GEMM's fresh output), as vLLM's layers do."""
    if _STATE.world_size == 1:
        return x
    import torch.distributed as dist
    out = x if x.is_contiguous() else x.contiguous()
    dist.all_reduce(out, group=_STATE.group)
    return out


def tensor_model_parallel_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The ranks' ``x`` concatenated along ``dim`` in rank order (every rank gets all of it)."""
    if _STATE.world_size == 1:
        return x
    import torch.distributed as dist
    parts = [torch.empty_like(x) for _ in range(_STATE.world_size)]
    dist.all_gather(parts, x.contiguous(), group=_STATE.group)
    return torch.cat(parts, dim=dim)
