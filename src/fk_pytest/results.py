"""What the session learned about each task, kept as tests finish (so nothing is lost mid-run)."""
from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Optional, Tuple

from . import status
from .correctness import CaseResult
from .phases import total
from .speed import SpeedResult


@dataclasses.dataclass
class TaskRecord:
    name: str
    level: int
    family: str
    module_path: str
    class_name: str
    candidate_status: Optional[str] = None  # NOT_ATTEMPTED, IMPORT_ERROR, SIGNATURE_MISMATCH, ...
    candidate_message: str = ""
    cases: Dict[Tuple[str, str, int], CaseResult] = dataclasses.field(default_factory=dict)
    speed: Dict[str, SpeedResult] = dataclasses.field(default_factory=dict)
    task_errors: List[str] = dataclasses.field(default_factory=list)
    swapped: List[str] = dataclasses.field(default_factory=list)  # candidate classes composed in
    failed_classes: Dict[str, str] = dataclasses.field(default_factory=dict)  # class -> "STATUS: why"
    seconds: float = 0.0  # wall time of the task's tests (setup, call, teardown): what it costs a run
    seconds_by_kind: Dict[str, float] = dataclasses.field(default_factory=dict)  # correctness/fuzz/speed
    tests_by_kind: Dict[str, int] = dataclasses.field(default_factory=dict)  # tests that ran, per kind

    # ---- derived --------------------------------------------------------------------------------
    @property
    def n_cases(self) -> int:
        return len(self.cases)

    @property
    def n_passed(self) -> int:
        return sum(c.passed for c in self.cases.values())

    @property
    def correctness(self) -> float:  # C_t
        return self.n_passed / self.n_cases if self.n_cases else 0.0

    @property
    def status(self) -> str:
        if self.candidate_status:
            return self.candidate_status
        if self.task_errors:
            return status.TASK_ERROR
        if not self.cases and not self.speed:
            return status.NOT_RUN
        failed = self._first_failure
        if failed is not None:
            return failed.status
        if any(s.suspect for s in self.speed.values()):
            return status.SUSPECT_SPEED
        if self.delegated:
            return status.DELEGATED
        return status.PASSED

    @property
    def _first_failure(self) -> Optional[CaseResult]:
        """The case that names the task's verdict: the first real failure, else the first case the
        candidate has not implemented (a half-written candidate that is also wrong is WRONG)."""
        failed = [c for c in self.cases.values() if not c.passed]
        return next((c for c in failed if c.status != status.NOT_IMPLEMENTED), failed[0] if failed else None)

    @property
    def delegated(self) -> List[str]:
        """Reference functions/kernels the candidate ran (allowed, but not a new kernel)."""
        return sorted({d for c in self.cases.values() for d in c.delegated})

    @property
    def valid(self) -> bool:
        return self.status == status.PASSED and self.n_cases > 0

    @property
    def message(self) -> str:
        if self.candidate_message:
            return self.candidate_message
        if self.task_errors:
            return self.task_errors[0]
        failed = self._first_failure
        if failed is not None:
            return f"[{failed.case_id}] {failed.message}"
        for s in self.speed.values():
            if s.suspect:
                return f"[{s.case_id}] {s.cand_us:.2f} us is below the roofline floor {s.roofline_floor_us:.2f} us"
        if self.delegated:
            return ("correct, but by running the reference's code (" + ", ".join(self.delegated[:4]) +
                    "): reported as delegation, not as a new kernel")
        return ""

    @property
    def timed(self) -> List[SpeedResult]:
        """The GPU timings S_t is made of: not a CPU timing, nor a case whose reference time is under
        the roofline floor (a ratio against an impossible denominator is no speedup)."""
        return [s for s in self.speed.values() if not s.informational and not getattr(s, "ref_suspect", False)]

    @property
    def speedup(self) -> Optional[float]:
        """S_t: weighted geometric mean over workload cases of GPU speedups (valid tasks only)."""
        timed = self.timed
        if not self.valid or not timed:
            return None
        total = sum(s.weight for s in timed)
        return math.exp(sum(s.weight * math.log(s.speedup) for s in timed) / total)

    @property
    def informational_speedup(self) -> Optional[float]:
        cpu = [s for s in self.speed.values() if s.informational]
        if not cpu:
            return None
        return math.exp(sum(math.log(s.speedup) for s in cpu) / len(cpu))

    def as_json(self) -> dict:
        speedup = self.speedup
        return {
            "name": self.name, "level": self.level, "family": self.family,
            "module": self.module_path, "class": self.class_name,
            "status": self.status, "message": self.message, "valid": self.valid,
            "cases_total": self.n_cases, "cases_passed": self.n_passed, "C_t": self.correctness,
            "S_t": speedup, "fast_1": bool(speedup is not None and speedup > 1.0),
            "informational_cpu_speedup": self.informational_speedup,
            "swapped_modules": self.swapped, "failed_classes": self.failed_classes,
            "delegated": self.delegated, "seconds": round(self.seconds, 3),
            "seconds_by_kind": {k: round(v, 3) for k, v in self.seconds_by_kind.items()},
            "tests_by_kind": dict(self.tests_by_kind),
            "phases": total([c.phases for c in self.cases.values()] + [s.phases for s in self.speed.values()]),
            "cases": [c.as_json() for c in self.cases.values()],
            "speed": [s.as_json() for s in self.speed.values()],
        }


@dataclasses.dataclass(frozen=True)
class TaskInfo:
    """What the results need of a task (picklable: travels from xdist workers to the controller)."""

    name: str
    level: int
    family: str
    module_path: str
    class_name: str

    @staticmethod
    def of(task) -> "TaskInfo":
        return TaskInfo(task.name, task.level, task.family, task.module_path, task.class_name)


class Results:
    """Every verdict of the session. With ``journal=True`` (an xdist worker) each change is also
    appended to :attr:`journal`, so the controller can replay it into the one merged report."""

    def __init__(self, journal: bool = False):
        self.tasks: Dict[str, TaskRecord] = {}
        self.e2e: Dict[str, "E2EResult"] = {}  # end-to-end case id -> result (NOT_RUN until it runs)
        self.roofline: Optional[dict] = None  # measured by the first GPU timing
        self.journal: Optional[List[tuple]] = [] if journal else None

    def _log(self, method: str, *args) -> None:
        if self.journal is not None:
            self.journal.append((method, args))

    def replay(self, events: List[tuple]) -> None:
        """Apply another process's journal (only the recording methods below can be named)."""
        for method, args in events:
            if method not in _REPLAYABLE:
                raise ValueError(f"not a Results event: {method!r}")
            getattr(self, method)(*args)

    def register_e2e(self, spec, case) -> None:
        from .e2e import E2EResult
        if case.id not in self.e2e:
            self.add_e2e_placeholder(E2EResult(case.id, spec.name, spec.family, case["model"], case["scenario"]))

    def add_e2e_placeholder(self, result) -> None:
        self._log("add_e2e_placeholder", result)
        self.e2e.setdefault(result.case_id, result)

    def record_e2e(self, result) -> None:
        self._log("record_e2e", result)
        self.e2e[result.case_id] = result

    def record_roofline(self, roofline: dict) -> None:
        self._log("record_roofline", roofline)
        self.roofline = roofline

    def register(self, task) -> TaskRecord:
        if task.name not in self.tasks:
            self._log("register", TaskInfo.of(task))
            self.tasks[task.name] = TaskRecord(task.name, task.level, task.family, task.module_path,
                                               task.class_name)
        return self.tasks[task.name]

    def record_case(self, task, result: CaseResult) -> None:
        rec = self.register(task)
        self._log("record_case", TaskInfo.of(task), result)
        rec.cases[(result.kind, result.case_id, result.seed)] = result
        for name in getattr(result, "swapped", []):
            if name not in rec.swapped:
                rec.swapped.append(name)
        for name, why in getattr(result, "failed", {}).items():
            rec.failed_classes.setdefault(name, why)

    def record_speed(self, task, result: SpeedResult) -> None:
        rec = self.register(task)
        self._log("record_speed", TaskInfo.of(task), result)
        rec.speed[result.case_id] = result

    def record_candidate_problem(self, task, problem_status: str, message: str) -> None:
        rec = self.register(task)
        self._log("record_candidate_problem", TaskInfo.of(task), problem_status, message)
        rec.candidate_status, rec.candidate_message = problem_status, message

    def add_seconds(self, task, seconds: float, kind: Optional[str] = None, first_phase: bool = False) -> None:
        """``seconds`` of one test phase (setup, call or teardown) of a test of ``kind``;
        ``first_phase`` marks its setup, so each test counts once in ``tests_by_kind``."""
        rec = self.register(task)
        self._log("add_seconds", TaskInfo.of(task), seconds, kind, first_phase)
        rec.seconds += seconds
        if kind is not None:
            rec.seconds_by_kind[kind] = rec.seconds_by_kind.get(kind, 0.0) + seconds
            if first_phase:
                rec.tests_by_kind[kind] = rec.tests_by_kind.get(kind, 0) + 1

    def record_task_error(self, task, message: str) -> None:
        rec = self.register(task)
        self._log("record_task_error", TaskInfo.of(task), message)
        if message not in rec.task_errors:
            rec.task_errors.append(message)


_REPLAYABLE = {"register", "add_e2e_placeholder", "record_e2e", "record_roofline", "record_case",
               "record_speed", "record_candidate_problem", "record_task_error", "add_seconds"}
