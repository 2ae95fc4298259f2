"""The peer contract: what the suite declares per op (``tasks/peers.py``), and the two peers every op has.

A peer's ``build`` gets a :class:`PeerContext` and returns ``fn(inputs) -> outputs``, or raises
:class:`Unsupported` / :class:`Skipped`; an op's :class:`OpPeers` lists its peers, the reference's
bandwidth :class:`Target` s and which cases the benchmark runs.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from ..build import instantiate
from ..registry import _suite_package
from ..task import Case, Task

# The reference's name among the implementations of a case record.
REFERENCE = "reference"


class PeerNotRun(Exception):
    """A peer that does not run on this case; ``status`` says why in one word."""

    status = "unsupported"


class Unsupported(PeerNotRun):
    """The implementation cannot compute this case (a backend without GQA, a style it lacks)."""

    status = "unsupported"


class Skipped(PeerNotRun):
    """Not run by choice or circumstance (library absent, --no-compile, no GPU)."""

    status = "skipped"


@dataclasses.dataclass
class PeerContext:
    """What a peer's ``build`` gets: the case, the reference instance (weights to share) and options."""

    task: Task
    case: Case
    reference: torch.nn.Module
    state: Dict[str, torch.Tensor]
    device: torch.device
    compile: bool
    notes: List[str] = dataclasses.field(default_factory=list)

    def new_reference(self) -> torch.nn.Module:
        """A second reference instance on the same weights (for peers that patch the module)."""
        return instantiate(self.task.reference, self.task, self.case, self.state, self.device, self.case.dtype)

    def note(self, text: str) -> None:
        self.notes.append(text)


# What kind of implementation a peer is. A reference that beats torch eager or Inductor says little
# about production; one that matches the kernels serving stacks and kernel libraries ship says that
# its speedups are honest. Reports give the ratio against each kind apart.
PRODUCTION = "production"  # kernels serving stacks and kernel libraries ship (Liger, SDPA's flash/cuDNN, FlashInfer)
FRAMEWORK = "framework"  # what a framework makes of plain PyTorch (eager, torch.compile, flex_attention)
PEER_KINDS = (PRODUCTION, FRAMEWORK)


@dataclasses.dataclass(frozen=True)
class Peer:
    """An implementation a user could pick. ``build(ctx)`` returns ``fn(inputs) -> outputs`` in the
    task's output convention (inputs the task writes in place are read back after the call), or
    raises :class:`Unsupported` / :class:`Skipped`. ``kind``: :data:`PRODUCTION` or
    :data:`FRAMEWORK`; ``version()``: the version of what it runs, read at run time (None: torch's)."""

    name: str
    description: str
    build: Callable[[PeerContext], Callable[[Dict[str, Any]], Any]]
    kind: str = FRAMEWORK
    version: Optional[Callable[[], Optional[str]]] = None

    def __post_init__(self):
        if self.kind not in PEER_KINDS:
            raise ValueError(f"peer {self.name!r}: kind must be one of {PEER_KINDS}, got {self.kind!r}")

    def version_text(self) -> str:
        """'<library> <version>' of what this peer runs, or 'absent' when its library is missing."""
        if self.version is None:
            return f"torch {torch.__version__}"
        try:
            found = self.version()
        except Exception:  # a library that fails to report is as good as absent here
            found = None
        return found or "absent"


def package_version(distribution: str) -> Callable[[], Optional[str]]:
    """A ``Peer.version`` reading an installed distribution's version ('name x.y.z'), None if absent."""
    def read():
        from importlib import metadata
        try:
            return f"{distribution} {metadata.version(distribution)}"
        except metadata.PackageNotFoundError:
            return None
    return read


@dataclasses.dataclass(frozen=True)
class Target:
    """The reference must reach ``min_bw_frac`` of the measured copy bandwidth on the cases it applies to.

    ``metric`` names the reference's rate that is held to the bar: ``bw_frac`` (copy bandwidth) by
    default, or ``roofline_frac`` (time at the roofline floor / time: the fraction of bf16 GEMM peak
    where a case is compute-bound, as a prefill GEMM is)."""

    name: str
    min_bw_frac: float
    applies: Callable[[Case], bool]
    metric: str = "bw_frac"


@dataclasses.dataclass(frozen=True)
class Ceiling:
    """A read of the bytes a case must read, without the op: ``build(ctx)`` returns ``fn(inputs)``,
    timed in the same interleaved loop as the reference and the peers on the cases ``applies`` to,
    never checked (it computes nothing the op does) and never a peer. The fastest of an op's
    ceilings is what a ``ceiling_frac`` target holds the reference to (its time / the reference's)."""

    name: str
    description: str
    build: Callable[[PeerContext], Callable[[Dict[str, Any]], Any]]
    applies: Callable[[Case], bool]


@dataclasses.dataclass(frozen=True)
class OpPeers:
    """One op's peers and what the reference must reach against them: its bandwidth ``targets``; no
    case's ratio to the best peer under ``shape_floor`` (None: the benchmark's default); and, where
    ``production_floor`` is set, no case's ratio to the best *production* peer under it; ``ceilings``
    are reads of the case's bytes timed beside them (:class:`Ceiling`)."""

    peers: Tuple[Peer, ...]
    targets: Tuple[Target, ...] = ()
    case_filter: Callable[[Case], bool] = lambda case: True
    shape_floor: Optional[float] = None
    production_floor: Optional[float] = None
    ceilings: Tuple[Ceiling, ...] = ()


def suite_peers_module():
    """The suite's peer definitions: ``tasks/peers.py``, installed as ``fk_tasks.peers``."""
    return importlib.import_module(_suite_package().__name__ + ".peers")


def suite_ops() -> Dict[str, OpPeers]:
    return suite_peers_module().OPS

# ---- the two peers every op has ----------------------------------------------------------------
def _native(ctx: PeerContext):
    module, task = ctx.reference, ctx.task
    return lambda inputs: task.call(module, inputs, "forward_native")


def _allow_recompiles(limit: int = 256) -> None:
    """Dynamo counts compilations per code object (every case compiles the same forward_native,
    with and without grad mode) and silently runs eager past its limit (8): the compile peer would
    then be timed as eager PyTorch."""
    import torch._dynamo.config as dynamo_config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dynamo_config, name):
            setattr(dynamo_config, name, max(getattr(dynamo_config, name), limit))


def compiled_native(ctx: PeerContext, dynamic: Optional[bool] = False):
    """Inductor on the reference's plain-PyTorch semantics, one graph per shape (dynamic=False), the
    way a serving engine compiles per captured batch size. ``dynamic=None`` is torch's default
    (shapes that change become symbolic after the first recompile), for ops whose inner shapes
    change with the data itself (an MoE expert loop's rows per expert)."""
    if not ctx.compile:
        raise Skipped("torch.compile disabled (--no-compile)")
    module = ctx.new_reference()
    _allow_recompiles()
    # An instance attribute shadows the method, so task.call (which binds caches and the forward
    # context for attention) runs the compiled function.
    module.forward_native = torch.compile(module.forward_native, dynamic=dynamic)
    return lambda inputs: ctx.task.call(module, inputs, "forward_native")


EAGER = Peer("eager", "the reference's forward_native in eager PyTorch (what a user writes)", _native)
COMPILE = Peer("compile", "torch.compile(forward_native, dynamic=False): Inductor", compiled_native)
