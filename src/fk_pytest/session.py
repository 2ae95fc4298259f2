"""Session-wide state: resolved options, the candidate source, results and the roofline."""
from __future__ import annotations

import time
import zlib
from typing import Dict, Optional

from . import status
from .candidates import CandidateSource
from .correctness import CaseResult
from .errors import CandidateError, NotAttempted
from .provenance import suite_info
from .evaluator import Evaluator, task_ref
from .report import build_report, environment, write_html, write_json
from .results import Results
from .task import Task
from .worker import WorkerClient, WorkerFailure

PROFILES = ("cpu", "full")
MODES = ("independent", "composed")
ISOLATION = ("process", "none")
PROGRESS_WRITE_SHARE = 0.1  # at most this share of the run rewrites the report while it goes on


class FKSession:
    def __init__(self, *, device: str, candidate: Optional[str], mode: str, profile: str,
                 seed: Optional[int], report_path: Optional[str], html_path: Optional[str] = None,
                 fuzz_examples: Optional[int] = None, isolation: str = "process",
                 timeout_s: float = 600.0, e2e_scale: Optional[float] = None,
                 worker_env: Optional[dict] = None, journal: bool = False, thorough: bool = False):
        self.device = device
        self.mode = mode
        self.profile = profile
        self.seed = seed
        self.report_path = report_path
        self.html_path = html_path
        self._next_progress_write = 0.0  # monotonic time before which write_progress does nothing
        self.fuzz_examples = fuzz_examples
        self.thorough = thorough  # --fk-thorough: every fuzz example and timing round of the full settings
        self.isolation = isolation
        self.timeout_s = timeout_s
        self.e2e_scale = e2e_scale  # None: the e2e spec's default for the profile
        # The session describes the candidate (path, hash) but never imports it: candidate code
        # runs in the evaluator, a child process unless --fk-isolation=none.
        self.candidates = CandidateSource(candidate) if candidate else None
        self.results = Results(journal=journal)
        self._checked: Dict[str, Exception] = {}
        self._dead: Dict[str, WorkerFailure] = {}  # task -> the crash/timeout that ended it
        self.record_cpu_benchmarks = False  # --fk-benchmark-cpu
        self.shard: Optional[tuple] = None  # (i, N) with --fk-shard: this run's share of the suite
        self.shard_costs: Optional[Dict[str, float]] = None  # seconds per group (--fk-shard-costs)
        self.remembered_costs: Dict[str, float] = {}  # seconds per group earlier runs left in the cache dir
        self.progress_sink = None  # set by the plugin: where phases of long runs are shown
        self.interrupted = False  # set by the plugin's SIGINT watch: the report can then not be complete
        self._progress_started = time.monotonic()
        if isolation == "process":
            self.evaluator = WorkerClient(candidate, device, timeout_s, mode, progress=self._progress,
                                          env=worker_env, thorough=thorough)
        else:
            from .guards import genuine_snapshot
            genuine_snapshot()  # before any candidate code is imported into this process
            self.evaluator = Evaluator(candidate, device, mode, progress=self._progress, thorough=thorough)

    def _progress(self, text: str) -> None:
        if self.progress_sink is not None:
            self.progress_sink(f"  ... {text} ({time.monotonic() - self._progress_started:.0f} s)")

    def close(self) -> None:
        if isinstance(self.evaluator, WorkerClient):
            self.evaluator.close()

    # ---- candidates -------------------------------------------------------------------------------
    def check_candidate(self, task: Task) -> None:
        """Raise NotAttempted / CandidateError if the candidate cannot be scored on ``task``."""
        if task.name not in self._checked:
            self.results.register(task)
            try:
                outcome, message = self.evaluator.load(task_ref(task))
            except WorkerFailure as exc:
                outcome, message = exc.status, f"loading the candidate: {exc.message}"
            if outcome == "ok":
                self._checked[task.name] = None
            elif outcome == "not_attempted":
                self.results.record_candidate_problem(task, status.NOT_ATTEMPTED, message)
                self._checked[task.name] = NotAttempted(message)
            else:
                self.results.record_candidate_problem(task, outcome, message)
                self._checked[task.name] = CandidateError(outcome, message)
        problem = self._checked[task.name]
        if problem is not None:
            raise problem

    def mark_not_attempted(self, task: Task, message: str) -> None:
        """The evaluator found the task untouched by the candidate (composed mode, no swap)."""
        self.results.record_candidate_problem(task, status.NOT_ATTEMPTED, message)
        self._checked[task.name] = NotAttempted(message)

    def _guarded(self, task: Task, op: str, *args):
        """Call the evaluator; after a crash or a hang, the task's remaining work is not run."""
        if task.name in self._dead:
            first = self._dead[task.name]
            raise WorkerFailure(first.status, f"not run: an earlier case of this task ended with "
                                f"{first.status} ({first.message})")
        try:
            return getattr(self.evaluator, op)(task_ref(task), *args)
        except WorkerFailure as exc:
            self._dead[task.name] = exc
            raise

    def evaluate(self, task: Task, case, seed: int, kind: str) -> CaseResult:
        try:
            return self._guarded(task, "evaluate", case, seed, kind)
        except WorkerFailure as exc:
            return CaseResult(case.id, kind, seed, exc.status, exc.message,
                              case=dict(case.params, dtype=str(case.dtype)) if kind == "fuzz" else None)

    def measure(self, task: Task, case, seed: int):
        """A SpeedResult, or raises CandidateError / WorkerFailure."""
        result, roofline = self._guarded(task, "speed", case, seed)
        if roofline and self.results.roofline is None:
            self.results.record_roofline(roofline)
        return result

    def evaluate_e2e(self, spec, case):
        """One end-to-end case, scored by the evaluator; recorded whatever happens."""
        from .e2e import E2EResult, spec_ref
        self._progress_started = time.monotonic()
        try:
            result = self.evaluator.e2e(spec_ref(spec), case)
        except (CandidateError, WorkerFailure) as exc:
            result = E2EResult(case.id, spec.name, spec.family, case["model"], case["scenario"],
                               status=exc.status, message=exc.message)
        self.results.record_e2e(result)
        return result

    # ---- seeds --------------------------------------------------------------------------------------
    def seed_for(self, case_id: str, index: int) -> int:
        """Stable per case and draw; --fk-seed mixes in a private seed for leaderboard runs."""
        text = f"{case_id}/{index}/{self.seed if self.seed is not None else ''}"
        return zlib.crc32(text.encode()) & 0x7FFFFFFF

    # ---- report ---------------------------------------------------------------------------------
    def run_info(self) -> dict:
        return {"device": self.device, "mode": self.mode, "profile": self.profile, "seed": self.seed,
                "isolation": self.isolation, "timeout_s": self.timeout_s,
                "effort": "thorough" if self.thorough else "quick", "e2e_scale": self.e2e_scale,
                "candidate": self.candidates.describe() if self.candidates else None,
                "shard": f"{self.shard[0]}/{self.shard[1]}" if self.shard else None,
                "suite": suite_info()}

    def report(self, complete: bool) -> dict:
        return build_report(self.results.tasks.values(), run=self.run_info(),
                            env=environment(self.device, self.results.roofline), complete=complete,
                            e2e=self.results.e2e.values())

    def write_progress(self) -> None:
        """The report so far, rewritten while the run goes on (a run that dies keeps what finished),
        but never more than PROGRESS_WRITE_SHARE of the time: each rewrite rebuilds and dumps the
        whole report, which grows with the run. Rewritten after every test, the 740 tests of the
        README's main job spent 73 ms a report event in the xdist controller on 2026-12-05, which
        then handed out work late and left both workers idle for 30-50 s of a 200 s run."""
        if not (self.report_path or self.html_path) or time.monotonic() < self._next_progress_write:
            return
        started = time.monotonic()
        self.write(complete=False)
        spent = time.monotonic() - started
        self._next_progress_write = time.monotonic() + spent * (1 - PROGRESS_WRITE_SHARE) / PROGRESS_WRITE_SHARE

    def write(self, complete: bool) -> Optional[dict]:
        if not (self.report_path or self.html_path):
            return None
        report = self.report(complete)
        if self.report_path:
            write_json(report, self.report_path)
        if self.html_path and complete:
            write_html(report, self.html_path)
        return report
