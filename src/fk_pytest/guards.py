"""Reward-hack guards that watch candidate code while it runs (see docs/threat-model.md).

* :func:`genuine_snapshot` / :func:`tampered` — the timers, CUDA events, graph replay and the
  suite's own functions are recorded before any candidate is imported; a candidate that replaces
  one of them is caught by identity.
* :class:`ReferenceTracer` — notices a candidate running reference code (delegation is allowed,
  but is reported as such, never as a new kernel).
* :func:`new_threads` — a candidate that leaves work running on another thread after it returns.
"""
from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Set

import torch

import kernels_reference

REFERENCE_DIR = str(Path(kernels_reference.__file__).resolve().parent)


def _watched() -> Dict[str, object]:
    items = {
        "time.perf_counter": time.perf_counter, "time.time": time.time,
        "time.monotonic": time.monotonic, "time.perf_counter_ns": time.perf_counter_ns,
        "torch.Tensor.copy_": torch.Tensor.copy_, "torch.Tensor.clone": torch.Tensor.clone,
        "torch.equal": torch.equal, "torch.isfinite": torch.isfinite,
    }
    if torch.cuda.is_available():
        ev = torch.cuda.Event
        items.update({
            "torch.cuda.Event": ev, "torch.cuda.Event.record": ev.record,
            "torch.cuda.Event.elapsed_time": ev.elapsed_time, "torch.cuda.Event.synchronize": ev.synchronize,
            "torch.cuda.synchronize": torch.cuda.synchronize,
            "torch.cuda.CUDAGraph.replay": torch.cuda.CUDAGraph.replay,
            "torch.cuda.graph": torch.cuda.graph, "torch.cuda.current_stream": torch.cuda.current_stream,
        })
    for name, module in list(sys.modules.items()):
        if name == "fk_pytest" or name.startswith("fk_pytest."):
            for attr, value in vars(module).items():
                if callable(value) and getattr(value, "__module__", None) == name:
                    items[f"{name}.{attr}"] = value
    return items


_GENUINE: Dict[str, object] = {}


def genuine_snapshot() -> None:
    """Record what is genuine. Call before any candidate code is imported."""
    if not _GENUINE:
        _GENUINE.update(_watched())


def tampered() -> List[str]:
    if not _GENUINE:
        return []
    now = _watched()
    return sorted(k for k, v in _GENUINE.items() if now.get(k) is not v)


class ReferenceTracer:
    """Record functions (and Triton kernels) of the task's own reference file run inside the block.

    Only the reference implementation *of the task* counts as delegation: a candidate that builds
    on reference children (an L2 candidate using the reference L1 modules) is the normal,
    independent-mode case.
    """

    def __init__(self, enabled: bool = True, module_path: str = ""):
        self.enabled = enabled
        self.target = str(Path(REFERENCE_DIR) / module_path) if module_path else REFERENCE_DIR
        self.hits: Set[str] = set()

    def _profile(self, frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if code.co_filename.startswith(self.target):
            self.hits.add(f"{Path(code.co_filename).stem}.{code.co_name}")
        elif code.co_name == "run" and "self" in frame.f_locals:
            fn = getattr(frame.f_locals["self"], "fn", None)  # a Triton JITFunction launch
            filename = getattr(getattr(fn, "__code__", None), "co_filename", "")
            if filename.startswith(self.target):
                self.hits.add(f"{Path(filename).stem}.{fn.__name__} (Triton kernel)")

    def __enter__(self):
        if self.enabled:
            self._previous = sys.getprofile()
            sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc):
        if self.enabled:
            sys.setprofile(self._previous)
        return False


def new_threads(before: Set[int], grace_s: float = 0.05) -> List[str]:
    """Threads started since ``before`` that are still running after a short grace period."""
    deadline = time.monotonic() + grace_s
    while True:
        alive = [t for t in threading.enumerate() if t.ident not in before and t.is_alive()]
        if not alive or time.monotonic() > deadline:
            return [t.name for t in alive]
        time.sleep(0.005)
