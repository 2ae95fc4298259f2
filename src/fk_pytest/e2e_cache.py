"""A model's end-to-end calibration kept on disk, so a second candidate pays only for itself.

The calibration of a model (:func:`fk_pytest.e2e_run.calibrate`: the reference's targets, its noise
runs and every built-in mutant, on both paths) depends on the reference and never on a candidate;
on the H200 it is most of an end-to-end run (Llama-3.1-8B: 90 of 170 s on 2026-12-02). With
``--fk-cache-dir=DIR`` it is stored under ``DIR/e2e`` and reused by the next run of the same suite.

An entry is keyed by everything its numbers depend on (:func:`fingerprint`): the spec and the
model's cases (ids, dtypes, params), the device (GPU name, CUDA and driver versions), torch and
triton, the source of the suite (every file of ``kernels_reference``, the spec's package and
``fk_pytest``) and the reference's weights (per parameter: shape, dtype, sum and sum of squares).
Any change gives another key. An entry that does not parse, whose key is not the one asked for, or
whose payload does not match its digest is reported and recomputed, never trusted.

The directory is trusted input, like the suite's own files: candidate code runs in the process
that writes it (the sterile worker), so a leaderboard run starts from an empty directory or none
(docs/threat-model.md).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import tempfile
from pathlib import Path
from typing import Callable, Dict, Optional

import torch

from .build import weights_digest

CACHE_DIR_ENV = "FK_CACHE_DIR"  # set by --fk-cache-dir; read by the evaluator (a worker inherits it)
FORMAT = 1
_FK_ROOT = Path(__file__).resolve().parent


def cache_dir() -> Optional[Path]:
    value = os.environ.get(CACHE_DIR_ENV)
    return Path(value) if value else None


@functools.lru_cache(maxsize=None)
def _tree_digest(roots) -> str:
    """One digest of the suite's source under ``roots`` (code and the data files tasks read);
    once per process and set of roots (a run does not change its own source)."""
    from .candidates import tree_hash
    return hashlib.sha256("".join(tree_hash(Path(r), (".py", ".txt", ".json")) for r in roots).encode()).hexdigest()


def suite_digest(package_file: str) -> str:
    """The digest of kernels_reference, the package holding ``package_file`` (a task or spec
    module) and fk_pytest: everything a reference-side number can depend on in this checkout."""
    import kernels_reference
    roots = (Path(kernels_reference.__file__).resolve().parent, Path(package_file).resolve().parent, _FK_ROOT)
    return _tree_digest(roots)


def versions(device: torch.device) -> dict:
    """The device and the versions a number measured or computed on it depends on."""
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {"device": _device(device), "torch": torch.__version__, "triton": triton_version,
            "interpret": os.environ.get("TRITON_INTERPRET")}


def _device(device: torch.device) -> dict:
    if device.type == "cuda":
        return dict(_cuda_device(device.index if device.index is not None else torch.cuda.current_device()))
    return {"type": device.type, "machine": platform.machine(), "threads": torch.get_num_threads()}


@functools.lru_cache(maxsize=None)
def _cuda_device(index: int) -> tuple:
    """Once per process and GPU: every cached case asks (the driver query is a subprocess)."""
    from .report import _nvidia_smi  # the report's own query of the driver
    return (("type", "cuda"), ("name", torch.cuda.get_device_name(index)), ("cuda", torch.version.cuda),
            ("driver", _nvidia_smi().get("driver")))


def fingerprint(spec, case, reference: torch.nn.Module, device: torch.device) -> dict:
    import importlib
    return {
        "format": FORMAT,
        "spec": [type(spec).__module__, type(spec).__qualname__, spec.name],
        "cases": [[c.id, str(c.dtype), sorted((k, repr(v)) for k, v in c.params.items())]
                  for c in spec.model_cases(case)],
        **versions(device),
        "source": suite_digest(importlib.import_module(type(spec).__module__).__file__),
        "weights": weights_digest(reference),
    }


def _payload_digest(payload) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


class JsonEntries:
    """Entries under ``root/sub``, one JSON file per key, each holding its key and its payload's
    digest: an entry that does not parse, answers another key or fails its digest is reported
    through ``progress`` and treated as absent (the caller recomputes and overwrites it)."""

    what, reused = "cache", "cache entry"  # how progress lines name an entry and a reuse

    def __init__(self, root: Path, sub: str, progress: Callable[[str], None]):
        self.root, self.progress = Path(root) / sub, progress

    def stem(self, key: dict) -> str:
        return "entry"

    def path(self, key: dict) -> Path:
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
        return self.root / f"{self.stem(key)}-{digest}.json"

    def load(self, key: dict, quiet: bool = False) -> Optional[dict]:
        path = self.path(key)
        if not path.exists():
            return None
        try:
            entry = json.loads(path.read_text())
            if entry.get("key") != json.loads(json.dumps(key)):
                raise ValueError("its key is not this run's")
            if entry.get("sha256") != _payload_digest(entry.get("payload")):
                raise ValueError("its payload does not match its digest")
        except (OSError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
            self.progress(f"{self.what} entry {path.name} not used ({exc}): recomputed")
            return None
        if not quiet:
            self.progress(f"{self.reused} reused from {path}")
        return entry["payload"]

    def store(self, key: dict, payload: Dict) -> None:
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        entry = {"key": key, "sha256": _payload_digest(payload), "payload": payload}
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(entry, f)
        os.replace(tmp, path)  # a reader sees the old entry or the whole new one


class DiskCalibrations(JsonEntries):
    """End-to-end calibrations under ``root/e2e``, one per model."""

    what, reused = "calibration cache", "calibration"

    def __init__(self, root: Path, progress: Callable[[str], None]):
        super().__init__(root, "e2e", progress)

    def stem(self, key: dict) -> str:
        return f"{key['spec'][2]}-{key['cases'][0][0]}"
