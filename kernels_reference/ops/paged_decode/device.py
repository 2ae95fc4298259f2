"""What this GPU and this Triton allow: SM count, programmatic dependent launch (grid dependency
control, with no-op stand-ins where it is missing), launch options, and ``VariantUnavailable`` for
a variant asked of a GPU / Triton without the feature. Shared by the decode, MLA and GEMV kernels.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from ...triton_rows import sm_count  # noqa: F401  (the decode launches import it from here)

try:
    import triton
except ImportError:  # the native path still works without Triton
    triton = None


class VariantUnavailable(RuntimeError):
    """A DecodeConfig asks for a feature this Triton / GPU does not have (e.g. PDL before sm_90)."""


try:  # Grid dependency control (PDL), in Triton since about 3.3; older: no-op stand-ins, unavailable
    from triton.language.extra.cuda import gdc_launch_dependents as _gdc_launch_dependents
    from triton.language.extra.cuda import gdc_wait as _gdc_wait
    _HAVE_GDC = True
except Exception:  # noqa: BLE001 - any import failure means the same: no PDL
    _HAVE_GDC = False
    if triton is not None:
        @triton.jit
        def _gdc_wait():
            pass

        @triton.jit
        def _gdc_launch_dependents():
            pass


def _cuda_launch_option(name: str) -> bool:
    """Does this Triton's CUDA backend take launch option ``name`` (``launch_pdl``, ``maxnreg``)?
    An unknown launch option is silently dropped by Triton, so without this check a variant would
    run as the default kernel (and its timing would be mislabelled)."""
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except Exception:  # noqa: BLE001
        return False
    return name in getattr(CUDAOptions, "__dataclass_fields__", {})


def pdl_unavailable_reason(device: torch.device) -> Optional[str]:
    """None when the PDL variants run with PDL on ``device``; else why not. Off the GPU (the
    interpreter) the variants run with the grid-dependency calls compiled out, so the reason
    is given but ``paged_decode`` does not refuse them there."""
    if triton is None:
        return "no Triton"
    if device.type != "cuda":
        return "not a CUDA device (the interpreter has no dependent launches)"
    return _cuda_pdl_unavailable_reason(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _cuda_pdl_unavailable_reason(device_index: int) -> Optional[str]:
    # cached: paged_decode asks on every call of a PDL config, and the answer never changes
    device = torch.device("cuda", device_index)
    if not _HAVE_GDC:
        return f"triton {triton.__version__} has no triton.language.extra.cuda.gdc_wait"
    if not _cuda_launch_option("launch_pdl"):
        return f"triton {triton.__version__} has no launch_pdl launch option"
    major, _ = torch.cuda.get_device_capability(device)
    if major < 9:
        return f"sm_{major}x: programmatic dependent launch needs sm_90 or newer"
    return None


def _f32_dot(query: torch.Tensor) -> bool:
    # float32 inputs keep full precision (no TF32); Triton's interpreter multiplies bfloat16
    # tiles wrongly (it reads their raw bits), so off the GPU half tiles are upcast first.
    return query.dtype == torch.float32 or not query.is_cuda


def _launch_options(pdl: bool, max_registers: Optional[int] = None) -> dict:
    # Passed only when asked for: the default launch stays what it was (and a Triton without
    # the option is never handed it: paged_decode has refused the variant there).
    options = {"launch_pdl": True} if pdl else {}
    if max_registers is not None:
        options["maxnreg"] = max_registers
    return options
