"""The reference's side of each kernel-level case kept on disk, so a second candidate pays only for
itself.

A case's verdict needs, besides the candidate's outputs, the reference's own error against the
float64 truth (the bar, :mod:`fk_pytest.compare`), and its speed needs the reference's time. Both
depend on the reference and the case, never on the candidate, and producing them costs as much as
the candidate's side: the reference's first call on each shape compiles its kernels (57 s of a
136 s rms_norm verdict on the H200, docs/perf/h200-cost.md), and timing it doubles the rounds.
With ``--fk-cache-dir=DIR`` they are stored under ``DIR/ref``, one entry per case, seed and kind:

* correctness (workload and fuzz cases): per output the reference's shape, dtype, relative L2 and
  per-element errors, and the truth's norm; for tasks that leave undetermined rows out (MoE
  routing near-ties), which rows and which input draw. Finding those rows runs the reference at
  the case dtype beside the truth (for an MoE model, a second model; the truth phase, which
  includes it, took 70 s over five tests of DeepSeek-V2-Lite's L4 cut in
  docs/perf/h200-suite-cost.md). The truth itself is recomputed every time (a full-size truth
  is gigabytes on disk): a recomputed truth whose norm or shape is not the stored one means the
  entry is stale, and the rows are found and the reference run again.
* speed (CUDA only): the reference's timing (per-call median, spread, rounds, calls per replay K,
  one-call time, the interval of its median) and its errors and undetermined rows on the inputs
  the timed path is checked on. The candidate is then timed alone with the stored K (the
  marginal cost of a call does not depend on K; K only sets how precisely it is measured).

Keys (:func:`case_key`): the task (module, name) and the case (id, dtype, params), the seed and
the kind, the GPU name, CUDA and driver versions, torch and triton, the interpreter switch, the
digest of the suite's source (``kernels_reference``, the task package and ``fk_pytest``) and,
for timings, the timing settings. Any change gives another key. An entry that does not parse,
answers another key or fails its digest is reported and recomputed, never trusted
(:class:`fk_pytest.e2e_cache.JsonEntries`).

A timing from the cache was measured in an earlier run, not interleaved with the candidate's: the
ratio then rests on the reference's times repeating across runs (within 3.1% for every case of two
rms_norm runs on the H200, docs/perf/h200-cost.md). ``--fk-no-cache`` times both side by side.
The directory is trusted input, as the end-to-end calibrations are (docs/threat-model.md): a
leaderboard run starts from an empty one, or fills it with the reference scoring itself.
"""
from __future__ import annotations

import importlib
from typing import Callable, Dict, List, Optional, Sequence

import torch

from .e2e_cache import JsonEntries, cache_dir, suite_digest, versions

FORMAT = 1
TRUTH_NORM_RTOL = 1e-9  # a recomputed float64 truth differs from the stored one by rounding at most


class ReferenceEntries(JsonEntries):
    what, reused = "reference cache", "reference"

    def stem(self, key: dict) -> str:
        return f"{key['task'][1]}-{key['kind']}-{key['seed']}"


def case_key(task, case, seed: int, kind: str, device: torch.device, timing: Optional[dict] = None) -> dict:
    # The whole task package (``tasks``), not the task's level folder: a task's inputs, configs and
    # workloads come from modules and data beside and above it (tasks/dense.py, tasks/configs).
    module = importlib.import_module(type(task).__module__.split(".")[0])
    key = {
        "format": FORMAT,
        "task": [type(task).__module__, task.name],
        "case": [case.id, str(case.dtype), sorted((k, repr(v)) for k, v in case.params.items())],
        "seed": seed,
        "kind": kind,
        **versions(device),
        "source": suite_digest(module.__file__),
    }
    if timing is not None:
        key["timing"] = timing
    return key


def truth_fingerprint(truths: Sequence[torch.Tensor]) -> List[dict]:
    return [{"shape": list(t.shape), "norm": float(torch.linalg.vector_norm(t.to(torch.float64).flatten()))
             if t.is_floating_point() else float(t.to(torch.float64).sum())} for t in truths]


def same_truth(stored: List[dict], now: List[dict]) -> bool:
    if len(stored) != len(now):
        return False
    for a, b in zip(stored, now):
        if a["shape"] != b["shape"]:
            return False
        if abs(a["norm"] - b["norm"]) > TRUTH_NORM_RTOL * max(abs(a["norm"]), abs(b["norm"]), 1e-300):
            return False
    return True


class ReferenceCache:
    """Reads and writes the entries; counts what it found (hits, misses, stale entries)."""

    def __init__(self, root, progress: Callable[[str], None]):
        self.entries = ReferenceEntries(root, "ref", progress)
        self.progress = progress
        self.counts: Dict[str, int] = {"hit": 0, "miss": 0, "stale": 0}

    @classmethod
    def from_environment(cls, progress: Callable[[str], None]) -> Optional["ReferenceCache"]:
        directory = cache_dir()
        return cls(directory, progress) if directory else None

    def load(self, key: dict) -> Optional[dict]:
        payload = self.entries.load(key, quiet=True)
        if payload is None:
            self.counts["miss"] += 1
        return payload

    def stale(self, key: dict, why: str) -> None:
        self.counts["stale"] += 1
        self.progress(f"reference cache entry {self.entries.path(key).name} is stale ({why}): recomputed")

    def hit(self) -> None:
        self.counts["hit"] += 1

    def store(self, key: dict, payload: dict) -> None:
        self.entries.store(key, payload)


def pack_rows(mask: torch.Tensor) -> dict:
    """An excluded-row mask as JSON: its shape and the flat indices of its True rows (few)."""
    return {"shape": list(mask.shape), "rows": torch.nonzero(mask.reshape(-1).cpu()).flatten().tolist()}


def unpack_rows(packed: dict) -> torch.Tensor:
    size = 1
    for n in packed["shape"]:
        size *= int(n)
    mask = torch.zeros(size, dtype=torch.bool)
    mask[packed["rows"]] = True
    return mask.reshape(packed["shape"])
