"""The pytest plugin: options, markers, parametrization, fixtures, the table and the reports.

Flow of a run: configure (resolve the device; on a CPU-only machine switch Triton to its
interpreter before any kernel module is imported) -> collect (task modules expose the standard
tests; ``pytest_generate_tests`` parametrizes them from workload cases) -> run (each test records
its verdicts in the session; the JSON report is rewritten after every test) -> summary (MacroEval
table; final JSON/HTML; the report is also embedded in pytest-benchmark's JSON).
"""
from __future__ import annotations

import os

import pytest

from .session import ISOLATION, MODES, PROFILES, FKSession

SESSION_KEY = pytest.StashKey[FKSession]()

LEVEL_MARKERS = {f"level{n}": f"FastKernels level-{n} task" for n in range(1, 5)}
FAMILY_MARKERS = {
    "norm": "normalisation tasks (RMSNorm, LayerNorm)",
    "activation": "activation tasks (SiluAndMul, GELU)",
    "rope": "rotary position embedding tasks",
    "linear": "linear layer / GEMM tasks",
    "embedding": "embedding and LM-head tasks",
    "attention": "attention tasks (prefill, decode)",
    "kv_cache": "KV-cache tasks",
    "mlp": "MLP blocks",
    "moe": "mixture-of-experts tasks",
    "layer": "decoder layers",
    "model": "whole models",
}


def pytest_addoption(parser):
    group = parser.getgroup("fastkernels", "FastKernels kernel benchmark")
    group.addoption("--fk-candidate", metavar="PATH", default=None,
                    help="candidate kernels: a folder laid out like kernels_reference (L1/rms_norm.py "
                         "holding class RMSNorm) or a single .py file. Default: the reference scores itself.")
    group.addoption("--fk-mode", choices=MODES, default="independent",
                    help="independent: each task's candidate runs with reference children (default); "
                         "composed: all candidates active together")
    group.addoption("--fk-device", choices=("auto", "cpu", "cuda"), default="auto",
                    help="where to run: auto picks cuda when available")
    group.addoption("--fk-report", metavar="PATH", default=None,
                    help="write the versioned JSON report here (rewritten after every test)")
    group.addoption("--fk-html", metavar="PATH", default=None, help="write an HTML report here")
    group.addoption("--fk-seed", type=int, default=None,
                    help="mix a private seed into fuzzed shapes and input draws (leaderboard runs)")
    group.addoption("--fk-profile", choices=PROFILES, default=None,
                    help="workload profile: cpu (small real shapes) or full (production shapes); "
                         "default: cpu on a CPU, full on CUDA")
    group.addoption("--fk-fuzz-examples", type=int, default=None, metavar="N",
                    help="hypothesis examples per fuzz test (default 6 for cpu, 25 for full)")
    group.addoption("--fk-isolation", choices=ISOLATION, default="process",
                    help="process: candidate code runs in a worker process that may crash or hang "
                         "without ending the run (default); none: in the pytest process")
    group.addoption("--fk-timeout", type=float, default=600.0, metavar="SECONDS",
                    help="time limit of one evaluation (a case, a timing) in the worker (default 600)")
    group.addoption("--fk-e2e-scale", type=float, default=None, metavar="X",
                    help="shrink the end-to-end serving scenarios (request count and lengths) by X in (0, 1] "
                         "(default: 0.25 on the full profile, 0.02 plus small caps on cpu)")


def _resolve_device(requested: str) -> str:
    import torch

    if requested == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError("--fk-device=cuda, but torch sees no CUDA device")
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return requested


def pytest_configure(config):
    for name, text in {**LEVEL_MARKERS, **FAMILY_MARKERS}.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    opt = config.option
    device = _resolve_device(opt.fk_device)
    if device == "cpu":
        # Triton kernels run on CPU tensors only through the interpreter, and Triton reads this
        # when a kernel is decorated: set it before any kernel module is imported.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        session = FKSession(device=device, candidate=opt.fk_candidate, mode=opt.fk_mode,
                            profile=opt.fk_profile or ("full" if device == "cuda" else "cpu"),
                            seed=opt.fk_seed, report_path=opt.fk_report, html_path=opt.fk_html,
                            fuzz_examples=opt.fk_fuzz_examples, isolation=opt.fk_isolation,
                            timeout_s=opt.fk_timeout, e2e_scale=opt.fk_e2e_scale)
    except (FileNotFoundError, ValueError) as exc:
        raise pytest.UsageError(str(exc))
    config.stash[SESSION_KEY] = session


def get_session(config) -> FKSession:
    return config.stash[SESSION_KEY]


def pytest_generate_tests(metafunc):
    e2e = getattr(metafunc.function, "_fk_e2e", None)
    if e2e is not None:
        fk = get_session(metafunc.config)
        cases = list(e2e.cases(fk.profile, fk.e2e_scale))
        metafunc.parametrize("case", cases, ids=[c.id for c in cases])
        return
    task = getattr(metafunc.function, "_fk_task", None)
    if task is None:
        return
    session = get_session(metafunc.config)
    if metafunc.function._fk_kind == "fuzz":
        from .task import DTYPES

        names = list(getattr(task, "fuzz_dtypes", ("bf16", "fp16", "fp32")))
        metafunc.parametrize("dtype", [DTYPES[n] for n in names], ids=names)
    else:
        cases = list(task.cases(session.profile))
        ids = [c.id for c in cases]
        if len(set(ids)) != len(ids):
            raise ValueError(f"task {task.name}: duplicate case ids")
        metafunc.parametrize("case", cases, ids=ids)


def pytest_collection_finish(session):
    """Every selected task appears in the report, as NOT_RUN until one of its tests runs."""
    fk = get_session(session.config)
    for item in session.items:
        task = getattr(getattr(item, "function", None), "_fk_task", None)
        if task is not None:
            fk.results.register(task)
        e2e = getattr(getattr(item, "function", None), "_fk_e2e", None)
        if e2e is not None and hasattr(item, "callspec"):
            fk.results.register_e2e(e2e, item.callspec.params["case"])


@pytest.fixture(scope="session")
def fk_session(request) -> FKSession:
    return get_session(request.config)


@pytest.fixture
def fk_check(fk_session):
    """Score a kernel class on a task's case with the calibrated check, from any repo's tests.

    ``fk_check("rms_norm", case, MyRMSNorm)`` runs reference, candidate and float64 truth on the
    case's realistic inputs and fails the test with the verdict if the kernel is wrong.
    """
    from .candidates import check_signatures
    from .correctness import evaluate_case
    from .registry import get_task

    def check(task, case, candidate_cls, seeds: int = 1):
        task = get_task(task) if isinstance(task, str) else task
        check_signatures(task.reference, candidate_cls)
        results = [evaluate_case(task, case, fk_session.seed_for(case.id, i), candidate_cls, fk_session.device)
                   for i in range(seeds)]
        for r in results:
            if not r.passed:
                pytest.fail(f"{r.status} [{r.case_id}]: {r.message}", pytrace=False)
        return results

    return check


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    fn = getattr(item, "function", None)
    if getattr(fn, "_fk_task", None) is not None or getattr(fn, "_fk_e2e", None) is not None:
        get_session(item.config).write(complete=False)


def pytest_sessionfinish(session, exitstatus):
    fk = session.config.stash.get(SESSION_KEY, None)
    if fk is None:
        return
    fk.close()
    if fk.results.tasks or fk.results.e2e:
        fk.write(complete=exitstatus in (0, 1))


@pytest.hookimpl(trylast=True)  # after pytest-benchmark's tables: the verdicts are the last word
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    fk = config.stash.get(SESSION_KEY, None)
    if fk is None or not (fk.results.tasks or fk.results.e2e):
        return
    from .report import format_table

    terminalreporter.section("FastKernels MacroEval")
    run = fk.run_info()
    cand = run["candidate"]["path"] if run["candidate"] else "none (the reference scores itself)"
    terminalreporter.write_line(f"candidate: {cand} | mode: {fk.mode} | device: {fk.device} | "
                                f"profile: {fk.profile}")
    terminalreporter.write_line(format_table(fk.report(complete=True)))
    if fk.report_path:
        terminalreporter.write_line(f"report: {fk.report_path}")


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_json(config, benchmarks, output_json):
    fk = config.stash.get(SESSION_KEY, None)
    if fk is not None and (fk.results.tasks or fk.results.e2e):
        output_json["fastkernels"] = fk.report(complete=True)
