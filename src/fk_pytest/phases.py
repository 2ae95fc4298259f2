"""Where the time of a run goes: wall seconds per phase of the evaluations.

The process that runs candidate code (the worker, or the pytest process with --fk-isolation=none)
accumulates seconds per phase as it works; each case or timing result takes what accumulated
since the last one (so a worker's start-up lands on the first result after it), the task record
adds them up, and the report shows them per task and for the run. On a GPU each phase ends with a
synchronisation, so work queued in one phase is not billed to the next.
"""
from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from typing import Dict

# In the order a case meets them; "worker_start" is the interpreter, imports and the evaluator,
# "release" the collection of the previous case's GPU memory, "warm_up" the timing runners' first
# calls before their graphs are captured (on a bare machine mostly compilation and autotuning:
# when one phase held both, rms_norm's speed tests billed it 22.2 s on a bare H100 and 1.0-1.4 s
# once the kernels were compiled, 2026-12-06, docs/perf/h100-2026-12-06g.md).
PHASES = ("worker_start", "release", "build", "inputs", "truth", "routing", "reference", "candidate", "compare",
          "warm_up", "capture", "timing", "timed_check")

_seconds: Dict[str, float] = defaultdict(float)
_inner: list = []  # per open phase, the seconds its nested phases took (billed to them, not to it)


def add(name: str, seconds: float) -> None:
    _seconds[name] += seconds


@contextlib.contextmanager
def phase(name: str, device=None):
    """Bill the block's seconds to ``name``; a phase opened inside it bills its own seconds, so a
    nested phase (the routing run inside an MoE truth, say) is not counted twice."""
    start = time.perf_counter()
    _inner.append(0.0)
    try:
        yield
    finally:
        if device is not None and getattr(device, "type", device) == "cuda":
            import torch
            torch.cuda.synchronize()
        took = time.perf_counter() - start
        _seconds[name] += took - _inner.pop()
        if _inner:
            _inner[-1] += took


def take() -> Dict[str, float]:
    """What accumulated since the last take, and start again."""
    out = {k: round(v, 4) for k, v in _seconds.items()}
    _seconds.clear()
    return out


def total(parts) -> Dict[str, float]:
    """Sum of several phase dicts, in PHASES order."""
    summed: Dict[str, float] = defaultdict(float)
    for p in parts:
        for k, v in (p or {}).items():
            summed[k] += v
    return {k: round(summed[k], 3) for k in sorted(summed, key=lambda k: (PHASES + (k,)).index(k))}
