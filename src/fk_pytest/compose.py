"""Composed mode: every candidate active at once, as they would be deployed together.

The candidate side of an L2..L4 task is built as the reference (or the task's own candidate) and
then each reference child whose class the candidate tree provides is rebuilt as the candidate's
class with the same constructor arguments and the child's weights (loaded strictly), its
parameters stored at the model's dtype as they are registered. The reference side of the
comparison is a separate instance and is never touched.

A class of the tree that cannot be loaded or built is not skipped silently: composition goes on
through the rest of the model (so the report can list what was composed and what failed), and the
caller then fails the task with the first failing class's status and a message naming it.
"""
from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch

import kernels_reference

from . import status
from .build import parameters_registered_at, weights_digest
from .errors import CandidateError, NotAttempted
from .signatures import construct, install_call_checks

REFERENCE_DIR = Path(kernels_reference.__file__).resolve().parent


def reference_module_path(cls: type) -> Optional[str]:
    try:
        path = Path(inspect.getfile(cls)).resolve()
        return str(path.relative_to(REFERENCE_DIR))
    except (TypeError, ValueError):
        return None


def candidate_lookup(source) -> Callable[[type], Optional[type]]:
    """ref class -> candidate class, or None where the tree does not replace it (no such file, or
    the file has no such class). A class the tree provides but that cannot be loaded raises its
    CandidateError (every time it is asked for)."""
    cache = {}

    def lookup(ref_cls: type) -> Optional[type]:
        if ref_cls not in cache:
            path = reference_module_path(ref_cls)
            try:
                cache[ref_cls] = source.load(path, ref_cls) if path and path.startswith("L") else None
            except NotAttempted:
                cache[ref_cls] = None
            except CandidateError as exc:
                # A file of the tree that lacks one of its classes (linear.py with only some of
                # the four linears) does not provide that class, and a stub is not written yet:
                # nothing to compose, no failure.
                cache[ref_cls] = None if exc.status in (status.MISSING_CLASS, status.NOT_IMPLEMENTED) else exc
        found = cache[ref_cls]
        if isinstance(found, CandidateError):
            raise found
        return found

    lookup.source = source  # the tree, for tensor-parallel ranks that compose it again
    return lookup


@dataclasses.dataclass
class Composition:
    """What composing a candidate tree into one module did."""

    swapped: List[str] = dataclasses.field(default_factory=list)  # reference classes replaced (each once)
    failed: Dict[str, str] = dataclasses.field(default_factory=dict)  # class -> "STATUS: why"
    first_failure: Optional[CandidateError] = None
    reference_written: bool = False  # a class's loading code changed the reference's weights

    def add_failure(self, ref_cls: type, exc: CandidateError) -> None:
        name = ref_cls.__name__
        if name in self.failed:
            return
        self.failed[name] = f"{exc.status}: {exc.message}"
        if self.first_failure is None:
            where = reference_module_path(ref_cls) or "?"
            self.first_failure = CandidateError(
                exc.status, f"composed mode: the candidate class {name} ({where}) failed: {exc.message}")

    def raise_if_failed(self) -> None:
        if self.first_failure is None:
            return
        others = list(self.failed)[1:]
        extra = f"; also failed: {', '.join(others)}" if others else ""
        done = f"; composed fine: {', '.join(self.swapped)}" if self.swapped else ""
        raise CandidateError(self.first_failure.status, self.first_failure.message + extra + done)


class ReferenceWritten(CandidateError):
    """A candidate class's own loading code changed the reference weights it was loading from."""

    def __init__(self, cls: type):
        super().__init__(status.TAMPERED, f"{cls.__name__}'s loading code (load_state_dict, _load_from_state_dict "
                                          "or a load hook) wrote into the reference weights it was given")


def _rebuild(child: torch.nn.Module, cand: type, source_shared: bool = False) -> torch.nn.Module:
    """``cand`` with the child's constructor arguments and weights (loaded strictly).

    ``source_shared``: the child holds the reference's own weight tensors (an end-to-end
    candidate is composed on such a copy). Only loading code of the candidate's own can reach them
    (an override of ``load_state_dict`` or ``_load_from_state_dict``, a load hook, a parameter of
    a tensor subclass); where the new module has any, the child's weights are digested before and
    after the load, and a change is :class:`ReferenceWritten`."""
    ref_param = next(child.parameters(), None)
    dtype = ref_param.dtype if ref_param is not None and ref_param.is_floating_point() else None
    dtype = None if dtype == torch.get_default_dtype() else dtype  # built at it anyway
    device = ref_param.device if ref_param is not None else None
    try:
        with parameters_registered_at(dtype):  # never the whole class in float32 beside the model
            new = construct(cand, child.init_args, device)
    except CandidateError as exc:
        if exc.status != status.RUNTIME_ERROR or dtype is None:
            raise
        # A constructor that needs its parameters at the default dtype (an init the model's dtype
        # lacks, such as a QR in bfloat16) is built as before, at the cost of the float32 copy.
        new = construct(cand, child.init_args, device)
    try:
        if ref_param is not None:
            new.to(device=ref_param.device, dtype=ref_param.dtype)
        before = weights_digest(child, buffers=False) if source_shared and runs_code_on_load(new) else None
        new.load_state_dict(child.state_dict(), strict=True)
    except torch.OutOfMemoryError:
        raise  # the device is full (a model too large to hold twice), not a layout the class got wrong
    except Exception as exc:
        raise CandidateError(status.STATE_DICT_MISMATCH,
                             f"the reference {type(child).__name__}'s state_dict does not load strictly "
                             f"into {cand.__name__}: {exc}") from exc
    if before is not None and weights_digest(child, buffers=False) != before:
        raise ReferenceWritten(cand)
    install_call_checks(new)
    return new.eval()


def runs_code_on_load(module: torch.nn.Module) -> bool:
    """Whether ``module.load_state_dict`` could run code other than torch's own on the tensors it is
    given: a class of the tree overriding the loading methods, a load hook, or a parameter or
    buffer of a tensor subclass (whose copy_ is its own)."""
    base = torch.nn.Module
    if type(module).load_state_dict is not base.load_state_dict:
        return True
    for m in module.modules():
        if type(m)._load_from_state_dict is not base._load_from_state_dict or m._load_state_dict_pre_hooks \
                or m._load_state_dict_post_hooks:
            return True
        for t in list(m._parameters.values()) + list(m._buffers.values()):
            if t is not None and type(t) not in (torch.Tensor, torch.nn.Parameter):
                return True
    return False


def swap_children(root: torch.nn.Module, lookup: Callable[[type], Optional[type]],
                  composition: Optional[Composition] = None, source_shared: bool = False) -> Composition:
    """Replace reference descendants by candidate classes, in place, recording what was swapped
    and what failed (a failed class keeps its reference module, whose children are still tried).
    ``source_shared``: ``root``'s reference modules hold the reference's own weights (see
    :func:`_rebuild`); a swapped module's descendants are the candidate's own."""
    composition = composition if composition is not None else Composition()
    for name, child in list(root.named_children()):
        cand = None
        if hasattr(child, "init_args"):
            try:
                cand = lookup(type(child))
                if cand is not None and cand is not type(child):
                    setattr(root, name, _rebuild(child, cand, source_shared))
                    if type(child).__name__ not in composition.swapped:  # each class once
                        composition.swapped.append(type(child).__name__)
                    # a candidate container may hold reference children of its own
                    swap_children(getattr(root, name), lookup, composition)
                    continue
            except ReferenceWritten as exc:
                composition.reference_written = True
                composition.add_failure(type(child), exc)
            except CandidateError as exc:
                composition.add_failure(type(child), exc)
        swap_children(child, lookup, composition, source_shared)
    return composition
