"""Calibrated comparison of one output against the float64 truth.

The bar is the reference's own error: ``ratio = e_cand / max(e_ref, floor)`` where ``e`` is the
relative L2 error against truth and ``floor`` is the error of merely representing the truth in the
output dtype (plus a small absolute floor for float32, where summation order alone moves the last
few bits). A second, per-element view (max error in units of the truth's RMS) catches errors
concentrated in a few elements that the L2 norm averages away.

Triton's CPU interpreter converts float32 to bfloat16 by truncation rather than rounding, so an
honest bf16 kernel interpreted on the CPU shows two to three times the rounding error (truncation
errors are biased, so several conversions add up). When the interpreter is active, bf16 bars are
calibrated the same way the kernel runs: the floor is the error of *truncating* the truth, and for
a candidate that launched interpreted Triton kernels the reference's error is the larger of its
native run and its own Triton path run in the interpreter (see :mod:`fk_pytest.correctness`). The verdict then charges a kernel for what it computes, not
for the interpreter's conversion; the GPU run, where conversions round, stays the strict one.
float32 bars count that interpreted run as well (the interpreter's summation order), with the
rounding floor.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Optional, Sequence, Tuple

import torch

from .errors import TaskDefinitionError

# Absolute relative-error floors per dtype (see module docstring).
ABS_FLOOR = {torch.float32: 1e-6, torch.float64: 1e-13}
ELEMENT_LIMIT_FACTOR = 2.0  # the per-element view gets twice the L2 limit: maxima are noisier


def triton_interpreter_active() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@dataclasses.dataclass
class OutputError:
    name: str
    e_ref: float
    e_cand: float
    floor: float
    ratio: float
    elem_ref: float
    elem_cand: float
    elem_floor: float
    elem_ratio: float

    def passed(self, limit: float) -> bool:
        return self.ratio <= limit and self.elem_ratio <= limit * ELEMENT_LIMIT_FACTOR


def _truncate_bf16(t: torch.Tensor) -> torch.Tensor:
    bits = t.to(torch.float32).contiguous().view(torch.int32) & ~0xFFFF
    return bits.view(torch.float32)


def represent(truth: torch.Tensor, dtype: torch.dtype, truncating: bool = False) -> torch.Tensor:
    """The truth as the best kernel could store it in ``dtype`` (see the interpreter note)."""
    if dtype == torch.bfloat16 and truncating:
        return _truncate_bf16(truth).to(torch.float64)
    return truth.to(dtype).to(torch.float64)


def _rel_l2(x: torch.Tensor, truth: torch.Tensor, truth_norm: float) -> float:
    return float(torch.linalg.vector_norm((x.to(torch.float64) - truth).flatten()) / truth_norm)


def _rel_max(x: torch.Tensor, truth: torch.Tensor, truth_rms: float) -> float:
    return float((x.to(torch.float64) - truth).abs().max() / truth_rms)


def check_discriminating(name: str, truth: torch.Tensor) -> None:
    """Refuse cases whose truth is zero or constant: any wrong kernel could pass them."""
    if not truth.is_floating_point() or truth.numel() == 0:
        return
    t = truth.to(torch.float64)
    rms = float(t.pow(2).mean().sqrt())
    spread = float(t.std()) if t.numel() > 1 else rms
    if not rms > 1e-30 or spread <= 1e-6 * rms:
        raise TaskDefinitionError(
            f"output {name!r} of this case has a degenerate truth (rms={rms:.3g}, std={spread:.3g}): "
            "zero or constant outputs cannot tell a right kernel from a wrong one")


# When the reference misses its own float64 truth by more than REFERENCE_SUSPECT (relative L2),
# its native form is run at the same dtype too, and the case is refused where the reference is more
# than REFERENCE_NATIVE_FACTOR times further off than that: a fast path that is broken, not
# imprecise. Of the 10,887 reference errors in the 60 GPU reports under docs/perf (2026-12-02..07,
# L1 to L4) all but 24 were at most 0.018; those 24 (0.22-1.23) are the gated delta rule's in two
# linear-attention runs of 2026-12-04 where its Triton kernel faulted on the GPU, and the example
# tree "passed" there with errors 500 times smaller than the bar: any candidate would have. A
# native form can be imprecise itself: RWKV-7's layer in bfloat16 on a one-token step misses by
# 0.092 on the CPU (where the reference runs natively), and its candidates by as much.
REFERENCE_SUSPECT = 0.02
REFERENCE_NATIVE_FACTOR = 10.0


def reference_suspect(errors: Sequence[Tuple[float, float]]) -> bool:
    """Whether any (L2, element) error is above REFERENCE_SUSPECT (or not finite)."""
    return any(not l2 <= REFERENCE_SUSPECT for l2, _ in errors)


def check_reference_errors(names: Sequence[str], errors: Sequence[Tuple[float, float]],
                           native_errors: Sequence[Tuple[float, float]]) -> None:
    """Refuse a case whose reference misses its float64 truth by more than REFERENCE_SUSPECT and by
    more than REFERENCE_NATIVE_FACTOR times its native form at the same dtype (``native_errors``),
    or is not finite: the reference's error is the bar every candidate is held to, so the case
    would pass anything."""
    for name, (l2, _), (native, _) in zip(names, errors, native_errors):
        if not l2 <= max(REFERENCE_SUSPECT, REFERENCE_NATIVE_FACTOR * native):
            raise TaskDefinitionError(
                f"the reference's own error on output {name!r} is {l2:.3g} (relative L2 against the float64 "
                f"truth), its native form's at the same dtype {native:.3g}: the reference is broken on this "
                "case, and a bar that wide would pass any candidate")


def reference_error(truth: torch.Tensor, ref: torch.Tensor) -> Tuple[float, float]:
    """(relative L2 error, max element error in units of the truth's RMS) of one reference output:
    what :func:`output_error` derives from ``refs``, kept by the reference cache."""
    truth = truth.to(torch.float64)
    norm = float(torch.linalg.vector_norm(truth.flatten()))
    rms = norm / max(truth.numel(), 1) ** 0.5
    return _rel_l2(ref, truth, norm), _rel_max(ref, truth, rms)


def output_error(name: str, truth: torch.Tensor, refs: Sequence[torch.Tensor], cand: torch.Tensor,
                 dtype: Optional[torch.dtype] = None, truncating: bool = False,
                 ref_errors: Optional[Tuple[float, float]] = None) -> OutputError:
    """``refs``: the reference's outputs (several when it ran more than one way; the worst counts).
    ``ref_errors``: the reference's (L2, element) errors known without its outputs (the reference
    cache), counted as one more way it ran. ``truncating``: the candidate's conversions truncate
    (interpreted Triton; see above)."""
    if isinstance(refs, torch.Tensor):
        refs = [refs]
    dtype = dtype or refs[0].dtype
    truth = truth.to(torch.float64)
    norm = float(torch.linalg.vector_norm(truth.flatten()))
    rms = norm / max(truth.numel(), 1) ** 0.5
    stored = represent(truth, dtype, truncating)
    floor = max(_rel_l2(stored, truth, norm), ABS_FLOOR.get(dtype, 0.0))
    elem_floor = max(_rel_max(stored, truth, rms), ABS_FLOOR.get(dtype, 0.0))
    known = [ref_errors] if ref_errors is not None else []
    e_ref = max([_rel_l2(r, truth, norm) for r in refs] + [e for e, _ in known])
    m_ref = max([_rel_max(r, truth, rms) for r in refs] + [m for _, m in known])
    e_cand, m_cand = _rel_l2(cand, truth, norm), _rel_max(cand, truth, rms)
    return OutputError(
        name=name, e_ref=e_ref, e_cand=e_cand, floor=floor, ratio=_ratio(e_cand, max(e_ref, floor)),
        elem_ref=m_ref, elem_cand=m_cand, elem_floor=elem_floor,
        elem_ratio=_ratio(m_cand, max(m_ref, elem_floor)),
    )


def _ratio(error: float, bar: float) -> float:
    """error / bar; an output the dtype holds exactly (bar 0) must then be exact."""
    if bar > 0:
        return error / bar
    return 0.0 if error == 0 else float("inf")
