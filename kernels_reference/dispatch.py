"""How every reference module chooses between its native and its fast path.

Production (vLLM's CustomOp) runs the hand-written kernel on CUDA tensors, plain PyTorch on the
CPU, and plain PyTorch under torch.compile so that Inductor can fuse it with its neighbours.
"""
import re

import torch

_HALF_TYPES = (torch.float16, torch.bfloat16)


def use_fast_path(*tensors: torch.Tensor) -> bool:
    if torch.compiler.is_compiling():
        return False
    return all(t is None or t.is_cuda for t in tensors)


def on_meta(*tensors: torch.Tensor) -> bool:
    """Shape-only execution (the workload capture builds models on the ``meta`` device): modules
    whose paths read values (routing, per-sequence lengths) return correctly shaped empty outputs."""
    return any(t is not None and t.is_meta for t in tensors)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half types compute in float32; float32 and float64 keep their precision.

    Keeping float64 as float64 is what lets ``forward_native`` on upcast inputs serve as the
    float64 ground truth of the correctness checks.
    """
    return torch.float32 if dtype in _HALF_TYPES else dtype


def op_name(op: str, module_name: str) -> str:
    """The custom op name a reference module registers: ``fk::<op>`` from the module in
    ``kernels_reference``; from a copy of its file imported under another name (a candidate tree
    that copies the reference) ``fk::<op>_<that name>``, so the copy registers its own op instead of
    colliding with the reference's."""
    if module_name.startswith("kernels_reference."):
        return f"fk::{op}"
    return f"fk::{op}_" + re.sub(r"\W", "_", module_name)
