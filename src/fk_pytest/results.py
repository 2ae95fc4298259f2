"""What the session learned about each task, kept as tests finish (so nothing is lost mid-run)."""
from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Optional, Tuple

from . import status
from .correctness import CaseResult
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
    swapped: List[str] = dataclasses.field(default_factory=list)

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
        for c in self.cases.values():
            if not c.passed:
                return c.status
        if any(s.suspect for s in self.speed.values()):
            return status.SUSPECT_SPEED
        if self.delegated:
            return status.DELEGATED
        return status.PASSED

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
        for c in self.cases.values():
            if not c.passed:
                return f"[{c.case_id}] {c.message}"
        for s in self.speed.values():
            if s.suspect:
                return f"[{s.case_id}] {s.cand_us:.2f} us is below the roofline floor {s.roofline_floor_us:.2f} us"
        if self.delegated:
            return ("correct, but by running the reference's code (" + ", ".join(self.delegated[:4]) +
                    "): reported as delegation, not as a new kernel")
        return ""

    @property
    def timed(self) -> List[SpeedResult]:
        return [s for s in self.speed.values() if not s.informational]

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
            "swapped_modules": self.swapped, "delegated": self.delegated,
            "cases": [c.as_json() for c in self.cases.values()],
            "speed": [s.as_json() for s in self.speed.values()],
        }


class Results:
    def __init__(self):
        self.tasks: Dict[str, TaskRecord] = {}
        self.e2e: Dict[str, "E2EResult"] = {}  # end-to-end case id -> result (NOT_RUN until it runs)

    def register_e2e(self, spec, case) -> None:
        from .e2e import E2EResult
        if case.id not in self.e2e:
            self.e2e[case.id] = E2EResult(case.id, spec.name, spec.family, case["model"], case["scenario"])

    def record_e2e(self, result) -> None:
        self.e2e[result.case_id] = result

    def register(self, task) -> TaskRecord:
        if task.name not in self.tasks:
            self.tasks[task.name] = TaskRecord(task.name, task.level, task.family, task.module_path,
                                               task.class_name)
        return self.tasks[task.name]

    def record_case(self, task, result: CaseResult) -> None:
        rec = self.register(task)
        rec.cases[(result.kind, result.case_id, result.seed)] = result
        for name in getattr(result, "swapped", []):
            if name not in rec.swapped:
                rec.swapped.append(name)

    def record_speed(self, task, result: SpeedResult) -> None:
        self.register(task).speed[result.case_id] = result

    def record_candidate_problem(self, task, problem_status: str, message: str) -> None:
        rec = self.register(task)
        rec.candidate_status, rec.candidate_message = problem_status, message

    def record_task_error(self, task, message: str) -> None:
        rec = self.register(task)
        if message not in rec.task_errors:
            rec.task_errors.append(message)
