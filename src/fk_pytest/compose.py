"""Composed mode: every candidate active at once, as they would be deployed together.

The candidate side of an L2..L4 task is built as the reference (or the task's own candidate) and
then each reference child whose class the candidate tree provides is rebuilt as the candidate's
class with the same constructor arguments and the child's weights (loaded strictly). The
reference side of the comparison is a separate instance and is never touched.
"""
from __future__ import annotations

import inspect
from pathlib import Path
from typing import Callable, List, Optional

import torch

import kernels_reference

from .errors import CandidateError, NotAttempted

REFERENCE_DIR = Path(kernels_reference.__file__).resolve().parent


def reference_module_path(cls: type) -> Optional[str]:
    try:
        path = Path(inspect.getfile(cls)).resolve()
        return str(path.relative_to(REFERENCE_DIR))
    except (TypeError, ValueError):
        return None


def candidate_lookup(source) -> Callable[[type], Optional[type]]:
    """ref class -> candidate class, or None where the tree does not replace it."""
    cache = {}

    def lookup(ref_cls: type) -> Optional[type]:
        if ref_cls not in cache:
            path = reference_module_path(ref_cls)
            try:
                cache[ref_cls] = source.load(path, ref_cls) if path and path.startswith("L") else None
            except NotAttempted:
                cache[ref_cls] = None
        return cache[ref_cls]

    return lookup


def swap_children(root: torch.nn.Module, lookup: Callable[[type], Optional[type]]) -> List[str]:
    """Replace reference descendants by candidate classes, in place; return the swapped names."""
    swapped = []
    for name, child in list(root.named_children()):
        cand = lookup(type(child)) if hasattr(child, "init_args") else None
        if cand is not None and cand is not type(child):
            try:
                new = cand(**child.init_args)
                ref_param = next(child.parameters(), None)
                if ref_param is not None:
                    new.to(device=ref_param.device, dtype=ref_param.dtype)
                new.load_state_dict(child.state_dict(), strict=True)
            except Exception as exc:
                raise CandidateError("STATE_DICT_MISMATCH" if "state_dict" in str(exc) else "RUNTIME_ERROR",
                                     f"composing {cand.__name__} in place of {type(child).__name__}: {exc}") from exc
            setattr(root, name, new.eval())
            swapped.append(type(child).__name__)
            swapped += swap_children(new, lookup)  # a candidate container may hold reference children
        else:
            swapped += swap_children(child, lookup)
    return swapped
