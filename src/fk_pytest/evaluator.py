"""Everything that runs candidate code, behind one small interface.

:class:`Evaluator` loads candidates, scores cases and times them. The session talks to it either
directly (``--fk-isolation=none``) or through :mod:`fk_pytest.worker`, which runs it in a child
process with a time limit, so that a segfault, a corrupted heap, a CUDA fault or an endless loop
in candidate code costs one task, not the run.
"""
from __future__ import annotations

import importlib
from typing import Dict, Optional, Tuple

import torch

from . import phases, status
from .candidates import CandidateSource
from .build import release_memory
from .compose import candidate_lookup
from .correctness import CaseResult, evaluate_case
from .errors import CandidateError, NotAttempted
from .speed import SpeedResult, measure_speed
from .task import Case, Task

RELEASE_ABOVE_BYTES = 16 << 30  # what cases may leave cached on the GPU before it is collected
TaskRef = Tuple[str, str]  # (module name, task name): how a task is found again in a worker


def task_ref(task: Task) -> TaskRef:
    return type(task).__module__, task.name


def resolve_task(ref: TaskRef) -> Task:
    module = importlib.import_module(ref[0])
    for value in vars(module).values():
        if isinstance(value, Task) and value.name == ref[1]:
            return value
    raise LookupError(f"no task {ref[1]!r} in {ref[0]}")


class Evaluator:
    def __init__(self, candidate_path: Optional[str], device: str, mode: str = "independent",
                 progress=None, thorough: bool = False):
        self.device, self.mode = device, mode
        self.thorough = thorough  # timing: fixed rounds (True) or until the speedup's CI is +-1%
        self.progress = progress or (lambda text: None)  # long runs (end to end) report phases here
        self._e2e_cache = None  # one model's end-to-end calibration (fk_pytest.e2e_run)
        self.source = CandidateSource(candidate_path) if candidate_path else None
        self._lookup = candidate_lookup(self.source) if self.source and mode == "composed" else None
        # End to end, every candidate is deployed together whatever --fk-mode says.
        self._e2e_lookup = (self._lookup or candidate_lookup(self.source)) if self.source else None
        self._history: Dict[str, Dict[str, str]] = {}  # per task: output digest -> first label
        self._traced: Dict[str, set] = {}  # per task: case variants already traced for delegation
        self.roofline: Optional[dict] = None
        self._flusher = None
        from .ref_cache import ReferenceCache
        self.ref_cache = ReferenceCache.from_environment(self.progress)  # --fk-cache-dir, else None

    def _class(self, task: Task) -> type:
        return self._resolve(task)[0]

    def _resolve(self, task: Task):
        """(class to score, whether it is the candidate's own class for this task)."""
        if not self.source:
            return task.reference, False
        try:
            return self.source.load_class(task), True
        except (NotAttempted, CandidateError) as exc:
            # Composed mode scores lower-level candidates inside a reference container, also when
            # the task's own class is still a stub.
            if isinstance(exc, CandidateError) and exc.status != status.NOT_IMPLEMENTED:
                raise
            lower = [p for p in self.source.module_paths() if int(p[1]) < task.level]
            if self._lookup is None or task.level == 1 or not lower:
                raise
            return task.reference, False

    def load(self, ref: TaskRef) -> Tuple[str, str]:
        """("ok", "") | ("not_attempted", why) | (status, message) for a candidate problem."""
        task = resolve_task(ref)
        try:
            self._class(task)
        except NotAttempted as exc:
            return "not_attempted", str(exc)
        except CandidateError as exc:
            return exc.status, exc.message
        return "ok", ""

    def _between_cases(self) -> None:
        """The previous case's modules, truth copies and graphs go before the next case builds its
        own (on the GPU only: full-size cases are GBs each; on the CPU the collector's own pace
        keeps up with the small shapes and a full collection per case would cost seconds). Only
        once the allocator holds more than RELEASE_ABOVE_BYTES: a full collection costs a tenth of
        a second or more, and small cases, most of a task's, leave nothing worth collecting."""
        if self.device == "cuda":
            with phases.phase("release"):
                if torch.cuda.memory_reserved() > RELEASE_ABOVE_BYTES:
                    release_memory()

    def evaluate(self, ref: TaskRef, case: Case, seed: int, kind: str) -> CaseResult:
        self._between_cases()
        task = resolve_task(ref)
        # Delegation is a property of the code path; tracing costs a lot under the interpreter,
        # so trace the first workload case of each output structure once.
        cls, own = self._resolve(task)
        variant = (kind, task.output_names(case), case.dtype)
        traced = self._traced.setdefault(task.name, set())
        trace = kind == "workload" and variant not in traced and own
        traced.add(variant)
        result = evaluate_case(task, case, seed, cls, self.device, kind,
                               history=self._history.setdefault(task.name, {}), trace_reference=trace,
                               compose=self._lookup, cache=self.ref_cache)
        result.phases = phases.take()
        if self.source is not None and not own and not result.swapped and not result.failed:
            # Composed mode found no candidate class anywhere inside this task's module (a class
            # that is there but failed to load or build is that class's failure, not this).
            if self.source.has_module(task):  # its own class is a stub (anything else raised above)
                result.status = status.NOT_IMPLEMENTED
                result.message = ("composed mode: this task's class is a stub and no other module of "
                                  "the candidate tree is used inside it")
            else:
                result.status = status.NOT_ATTEMPTED
                result.message = "composed mode: no module of the candidate tree is used inside this task"
        return result

    def e2e(self, ref, case: Case):
        """One end-to-end case (:mod:`fk_pytest.e2e`): an E2EResult."""
        from .e2e import resolve_spec
        from .e2e_embed import run_embedding_e2e
        from .e2e_run import CalibrationCache, run_e2e
        if self._e2e_cache is None:
            self._e2e_cache = CalibrationCache(progress=self.progress)
        spec = resolve_spec(ref)
        run = run_embedding_e2e if spec.scoring == "embeddings" else run_e2e
        return run(spec, case, self.device, self._e2e_lookup, self.source is not None,
                   cache=self._e2e_cache, progress=self.progress)

    def speed(self, ref: TaskRef, case: Case, seed: int) -> Tuple[SpeedResult, Optional[dict]]:
        self._between_cases()
        task = resolve_task(ref)
        if self.device == "cuda":
            from .timing import L2Flusher, measure_roofline
            if self.roofline is None:
                self.roofline = measure_roofline(torch.device("cuda"))
            if self._flusher is None:
                self._flusher = L2Flusher(torch.device("cuda"))
        result = measure_speed(task, case, self._class(task), self.device, seed,
                               roofline=self.roofline, flusher=self._flusher, compose=self._lookup,
                               thorough=self.thorough, cache=self.ref_cache)
        result.phases = phases.take()
        return result, self.roofline
