"""The standard tests, written once and attached to every task with one line:

    test_correctness, test_fuzz, test_speed = standard_tests(TASK)

``pytest_generate_tests`` (in the plugin) parametrizes them from the task's workload cases, so IDs
read ``test_speed[llama-3.1-8b-decode-T32-bf16]`` and ``-k``/``-m`` select naturally.
"""
from __future__ import annotations

import pytest

from . import status
from .correctness import CaseResult
from .errors import CandidateError, NotAttempted, TaskDefinitionError
from .fuzz import fuzz_settings
from .task import DTYPE_NAMES, Task
from .timing import bench_clock
from .worker import WorkerFailure


def resolve_candidate(session, task: Task) -> None:
    try:
        session.check_candidate(task)
    except NotAttempted as exc:
        pytest.skip(f"not attempted: {exc}")
    except CandidateError as exc:
        if exc.status == status.NOT_IMPLEMENTED:
            _xfail(f"{exc.status}: {exc.message}")  # a stub: still to do, not broken
        pytest.fail(f"{exc.status}: {exc.message}", pytrace=False)


def _xfail(reason: str) -> None:
    """``pytest.xfail`` without the traceback: pytest formats one for every xfail (reading the
    source of each frame, ~25 ms a test) only to discard it; a stub tree's run then cost seconds
    per hundred tests instead of its collection."""
    raise pytest.xfail.Exception(reason, pytrace=False)


def check_case(session, task: Task, case, kind: str, seeds: int) -> list:
    """Run ``seeds`` input draws of one case; record every result; return the failures."""
    resolve_candidate(session, task)
    failures = []
    for i in range(seeds):
        try:
            result = session.evaluate(task, case, session.seed_for(case.id, i), kind)
        except TaskDefinitionError as exc:
            session.results.record_task_error(task, f"[{case.id}] {exc}")
            raise
        if result.status == status.NOT_ATTEMPTED:
            session.mark_not_attempted(task, result.message)
            pytest.skip(f"not attempted: {result.message}")
        session.results.record_case(task, result)
        if not result.passed:
            failures.append(result)
    return failures


def _fail(failures: list) -> None:
    """End the test on its first real failure, or as xfail when every failure is a path the
    candidate raised NotImplementedError on."""
    failure = next((f for f in failures if f.status != status.NOT_IMPLEMENTED), failures[0])
    text = f"{failure.status} [{failure.case_id}, seed {failure.seed}]: {failure.message}"
    if failure.status == status.NOT_IMPLEMENTED:  # the candidate raised NotImplementedError here
        _xfail(text)
    pytest.fail(text, pytrace=False)


def standard_tests(task: Task):
    marks = [getattr(pytest.mark, f"level{task.level}"), getattr(pytest.mark, task.family)]

    def test_correctness(case, fk_session):
        failures = check_case(fk_session, task, case, "workload", task.seeds)
        if failures:
            _fail(failures)

    def test_fuzz(dtype, fk_session):
        from hypothesis import given

        resolve_candidate(fk_session, task)  # skip/fail before hypothesis starts drawing

        @fuzz_settings(fk_session.profile, fk_session.fuzz_examples, fk_session.seed, fk_session.thorough)
        @given(task.fuzz_strategy(dtype, fk_session.profile))
        def fuzz(case):
            failures = check_case(fk_session, task, case, "fuzz", 1)
            if failures and all(f.status == status.NOT_IMPLEMENTED for f in failures):
                unwritten.extend(failures)  # not a bug for hypothesis to shrink: still to do
            elif failures:
                _fail(failures)

        unwritten: list = []
        fuzz()
        if unwritten:
            _fail(unwritten)

    def test_speed(case, fk_session, benchmark):
        resolve_candidate(fk_session, task)
        try:
            result = fk_session.measure(task, case, fk_session.seed_for(case.id, 0))
        except (CandidateError, WorkerFailure) as exc:
            failure = CaseResult(case.id, "speed", 0, exc.status, exc.message)
            fk_session.results.record_case(task, failure)
            _fail([failure])
        except Exception as exc:  # --fk-isolation=none: candidate code failing while timed
            message = f"candidate failed while being timed: {type(exc).__name__}: {exc}"
            fk_session.results.record_case(task, CaseResult(case.id, "speed", 0, status.RUNTIME_ERROR, message))
            pytest.fail(message, pytrace=False)
        fk_session.results.record_speed(task, result)
        _record_benchmark(benchmark, task, case, result,
                          record=not result.informational or getattr(fk_session, "record_cpu_benchmarks", False))
        if result.suspect:
            pytest.fail(f"{status.SUSPECT_SPEED}: {result.cand_us:.2f} us is below the roofline floor "
                        f"{result.roofline_floor_us:.2f} us ({result.bytes} bytes at the measured copy "
                        "bandwidth): not a record but a suspect", pytrace=False)

    tests = (test_correctness, test_fuzz, test_speed)
    for fn, kind in zip(tests, ("correctness", "fuzz", "speed")):
        fn._fk_task, fn._fk_kind = task, kind
        fn.__doc__ = f"{kind} of {task.class_name} ({task.module_path}) — generated by fk_pytest"
        for mark in marks:
            mark(fn)
    return tests


def _record_benchmark(benchmark, task: Task, case, result, record: bool = True) -> None:
    """Hand the measured GPU times to pytest-benchmark (stats, JSON, --benchmark-compare).

    CPU timings are the Triton interpreter's wall time: informational, and a few hundred rows of
    them would bury the verdicts, so they reach pytest-benchmark only with --fk-benchmark-cpu."""
    if not record:
        benchmark.disabled = True  # the fixture runs the clock once and keeps no statistics
    benchmark.group = task.name
    benchmark.extra_info.update(result.as_json())
    benchmark.extra_info["dtype"] = DTYPE_NAMES.get(case.dtype, str(case.dtype))
    samples = result.samples_us or [result.cand_us]
    clock = bench_clock(samples)
    if hasattr(benchmark, "_timer"):
        benchmark._timer = clock
        benchmark.pedantic(clock.advance, rounds=len(samples), iterations=1, warmup_rounds=0)
