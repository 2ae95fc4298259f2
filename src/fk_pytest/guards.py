"""Reward-hack guards that watch candidate code while it runs (see docs/threat-model.md).

* :func:`genuine_snapshot` / :func:`tampered` — the timers, CUDA events, graph replay and the
  suite's own functions are recorded before any candidate is imported; a candidate that replaces
  one of them is caught by identity.
* :class:`ReferenceTracer` — notices a candidate running reference code (delegation is allowed,
  but is reported as such, never as a new kernel).
* :func:`new_threads` — a candidate that leaves work running on another thread after it returns.
"""
from __future__ import annotations

import ast
import functools
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Set

import torch

import kernels_reference

REFERENCE_DIR = str(Path(kernels_reference.__file__).resolve().parent)
OPS_DIR = str(Path(REFERENCE_DIR) / "ops")


def _ops_imported_by(path: Path) -> Set[Path]:
    """The kernels_reference/ops files that ``path`` (a file of kernels_reference) imports, at any
    depth of the file (the fast paths import their kernels lazily)."""
    root = Path(REFERENCE_DIR)
    package = list(path.relative_to(root).parts[:-1])  # the file's package, under kernels_reference
    modules = []  # dotted names under kernels_reference, as lists of parts
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules += [a.name.split(".")[1:] for a in node.names if a.name.startswith("kernels_reference.")]
        elif isinstance(node, ast.ImportFrom):
            named = (node.module or "").split(".") if node.module else []
            if node.level:
                base = package[:len(package) - node.level + 1] + named
            elif named[:1] == ["kernels_reference"]:
                base = named[1:]
            else:
                continue
            modules += [base] + [base + [a.name] for a in node.names]  # "from pkg import module" too
    found = set()
    for parts in modules:
        where = root.joinpath(*parts) if parts else root
        for file in (where.with_suffix(".py"), where / "__init__.py"):
            if parts and parts[0] == "ops" and file.is_file():
                found.add(file)
    return found


@functools.lru_cache(maxsize=None)
def reference_kernel_files(module_path: str) -> frozenset:
    """The kernels of a task's reference module: the ops files it imports, and the ops files those
    import, as absolute path strings (a candidate running one of them runs the reference's kernel)."""
    start = Path(REFERENCE_DIR) / module_path
    if not module_path or not start.is_file():
        return frozenset()
    seen: Set[Path] = set()
    todo = list(_ops_imported_by(start))
    while todo:
        path = todo.pop()
        if path not in seen:
            seen.add(path)
            todo.extend(_ops_imported_by(path))
    return frozenset(str(p) for p in seen)


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
    """Record functions (and Triton kernels) of the task's own reference file, and of the kernels
    under kernels_reference/ops that file imports, run inside the block.

    Only the reference implementation *of the task* counts as delegation: a candidate that builds
    on reference children (an L2 candidate using the reference L1 modules) is the normal,
    independent-mode case, so a reference kernel counts only when the candidate calls it itself,
    not when a reference child module (or other reference code outside ops) called it.
    """

    def __init__(self, enabled: bool = True, module_path: str = ""):
        self.enabled = enabled
        self.target = str(Path(REFERENCE_DIR) / module_path) if module_path else REFERENCE_DIR
        self.kernels = reference_kernel_files(module_path)
        self.hits: Set[str] = set()

    def _called_by_candidate(self, frame) -> bool:
        """No reference code outside ops (other than the task's own file) is on the stack."""
        frame = frame.f_back
        while frame is not None:
            name = frame.f_code.co_filename
            if (name.startswith(REFERENCE_DIR) and not name.startswith(OPS_DIR)
                    and not name.startswith(self.target)):
                return False
            frame = frame.f_back
        return True

    def _kernel_label(self, filename: str) -> str:
        return ".".join(Path(filename).relative_to(REFERENCE_DIR).with_suffix("").parts)

    def _profile(self, frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if code.co_filename.startswith(self.target):
            self.hits.add(f"{Path(code.co_filename).stem}.{code.co_name}")
        elif code.co_filename in self.kernels:
            if self._called_by_candidate(frame):
                self.hits.add(f"{self._kernel_label(code.co_filename)}.{code.co_name}")
        elif code.co_name == "run" and "self" in frame.f_locals:
            fn = getattr(frame.f_locals["self"], "fn", None)  # a Triton JITFunction launch
            filename = getattr(getattr(fn, "__code__", None), "co_filename", "")
            if filename.startswith(self.target):
                self.hits.add(f"{Path(filename).stem}.{fn.__name__} (Triton kernel)")
            elif filename in self.kernels and self._called_by_candidate(frame):
                self.hits.add(f"{self._kernel_label(filename)}.{fn.__name__} (Triton kernel)")

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
