"""The pytest plugin: options, markers, parametrization, fixtures, the table and the reports.

Flow of a run: configure (resolve the device; on a CPU-only machine switch Triton to its
interpreter before any kernel module is imported) -> collect (task modules expose the standard
tests; ``pytest_generate_tests`` parametrizes them from workload cases) -> run (each test records
its verdicts in the session; the JSON report is rewritten as the run goes) -> summary (MacroEval
table; final JSON/HTML; the report is also embedded in pytest-benchmark's JSON).
"""
from __future__ import annotations

import gc
import os
from pathlib import Path
import signal
import threading
from collections import Counter

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
    "conv": "convolution tasks of vision models (ConvNeXt's depthwise conv + norm)",
    "linear_attention": "linear-attention and state-space scans (gated delta rule, Mamba-2 SSD, conv states)",
    "layer": "decoder layers",
    "model": "whole models",
    "communication": "tensor-parallel collectives (the all-reduce, fused with the residual add and RMSNorm)",
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
                    help="write the versioned JSON report here (rewritten as the run goes and at the end)")
    group.addoption("--fk-html", metavar="PATH", default=None, help="write an HTML report here")
    group.addoption("--fk-seed", type=int, default=None,
                    help="mix a private seed into fuzzed shapes and input draws (leaderboard runs)")
    group.addoption("--fk-profile", choices=PROFILES, default=None,
                    help="workload profile: cpu (small real shapes) or full (production shapes); "
                         "default: cpu on a CPU, full on CUDA")
    group.addoption("--fk-fuzz-examples", type=int, default=None, metavar="N",
                    help="hypothesis examples per fuzz test (default 4 for cpu, 8 for full, 25 for full "
                         "with --fk-thorough)")
    group.addoption("--fk-thorough", action="store_true", default=False,
                    help="the costlier settings: 25 fuzz examples per test on the full profile and GPU "
                         "timing of fixed rounds (0.5 s a case, at least 50) instead of rounds that stop "
                         "once the speedup's 95%% confidence interval is within +-1%%")
    group.addoption("--fk-isolation", choices=ISOLATION, default="process",
                    help="process: candidate code runs in a worker process that may crash or hang "
                         "without ending the run (default); none: in the pytest process")
    group.addoption("--fk-timeout", type=float, default=600.0, metavar="SECONDS",
                    help="time limit of one evaluation (a case, a timing) in the worker (default 600)")
    group.addoption("--fk-benchmark-cpu", action="store_true", default=False,
                    help="also hand CPU timings (informational: the Triton interpreter's wall time) to "
                         "pytest-benchmark; by default its table appears only for GPU timings")
    group.addoption("--fk-shard", metavar="i/N", default=None,
                    help="run shard i of N (1 <= i <= N): a deterministic share of the selected tests, whole "
                         "tasks and whole end-to-end models; merge the shards' reports with fk-report --merge")
    group.addoption("--fk-shard-costs", metavar="REPORT", default=None,
                    help="balance --fk-shard by the seconds per task in this earlier report (default: test counts)")
    group.addoption("--fk-e2e-scale", type=float, default=None, metavar="X",
                    help="shrink the end-to-end serving scenarios (request count and lengths) by X in (0, 1] "
                         "(default: 0.25 on the full profile, 0.02 plus small caps on cpu)")
    group.addoption("--fk-cache-dir", metavar="DIR", default=None,
                    help="keep the reference's side of every case under DIR and reuse it in later runs whose "
                         "suite source, device and versions are the same: its errors against the float64 truth "
                         "and its GPU timings (DIR/ref), each end-to-end model's calibration (DIR/e2e: targets, "
                         "noise runs, built-in mutants); default: $FK_CACHE_DIR, else no cache")
    group.addoption("--fk-no-cache", action="store_true", default=False,
                    help="neither read nor write the cache (reference sides and calibrations), whatever "
                         "--fk-cache-dir or $FK_CACHE_DIR say: the reference runs, and is timed beside the candidate")
    group.addoption("--fk-stubs", metavar="DIR", default=None,
                    help="write a stub candidate tree with one prompt per task for the selected tasks "
                         "into DIR (new or empty), then end without running tests (fk_pytest.stubs)")
    group.addoption("--fk-stubs-author", metavar="NAME", default=None,
                    help="author or agent named in the stub tree's manifest (default: $FK_AUTHOR)")
    group.addoption("--fk-stubs-force", action="store_true", default=False,
                    help="let --fk-stubs write into a non-empty DIR")


def _resolve_device(requested: str) -> str:
    import torch

    if requested == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError("--fk-device=cuda, but torch sees no CUDA device")
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return requested


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """``-n N`` on the task suite distributes whole task modules (``--dist loadfile``) unless the
    user chose a distribution: a task's cases then share one worker's state (see fk_pytest.xdist)."""
    opt = config.option
    if getattr(opt, "numprocesses", None) and getattr(opt, "dist", None) == "no" and _targets_suite(config):
        opt.dist = "loadfile"
        # Files in collection order (pytest_collection_modifyitems puts the end-to-end tests first),
        # not xdist's default of the files with the most tests first: the end-to-end file has few
        # tests and is the longest, and handed out last it ran alone at the end (CPU main job,
        # 2026-12-03: one worker idle from 161 s to 303 s).
        opt.loadscopereorder = False


def _targets_suite(config) -> bool:
    import importlib.util
    from pathlib import Path

    roots = []
    for name in ("fk_tasks", "tasks"):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is not None and spec.submodule_search_locations:
            roots += [Path(p).resolve() for p in spec.submodule_search_locations]
    for arg in config.args:
        if arg in ("fk_tasks", "tasks") or arg.startswith("fk_tasks."):
            return True
        path = Path(arg.split("::")[0]).resolve()
        if any(path == r or r in path.parents or path in r.parents for r in roots):
            return True
    return False


@pytest.hookimpl(tryfirst=True)  # before pytest-benchmark's: see the xdist worker note below
def pytest_configure(config):
    from . import xdist

    for name, text in {**LEVEL_MARKERS, **FAMILY_MARKERS}.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    opt = config.option
    on_worker = xdist.worker_id(config) is not None
    if (on_worker or xdist.is_controller(config)) and not (
            getattr(opt, "benchmark_only", False) or getattr(opt, "benchmark_enable", False)):
        # pytest-benchmark cannot time under xdist and would say so on every run (controller and
        # workers): the FastKernels report carries the times, merged from the workers.
        opt.benchmark_disable = True
    device = _resolve_device(opt.fk_device)
    from .e2e_cache import CACHE_DIR_ENV
    if opt.fk_no_cache:  # the evaluator, in this process or a worker spawned from it, reads the variable
        os.environ.pop(CACHE_DIR_ENV, None)
    elif opt.fk_cache_dir:
        os.environ[CACHE_DIR_ENV] = str(Path(opt.fk_cache_dir).resolve())
    if device == "cpu":
        # Triton kernels run on CPU tensors only through the interpreter, and Triton reads this
        # when a kernel is decorated: set it before any kernel module is imported.
        os.environ.setdefault("TRITON_INTERPRET", "1")
        from .interpreter import patch_language_once
        patch_language_once()
    try:
        session = FKSession(device=device, candidate=opt.fk_candidate, mode=opt.fk_mode,
                            profile=opt.fk_profile or ("full" if device == "cuda" else "cpu"),
                            seed=opt.fk_seed,
                            # an xdist worker journals its verdicts; only the controller writes files
                            report_path=None if on_worker else opt.fk_report,
                            html_path=None if on_worker else opt.fk_html,
                            fuzz_examples=opt.fk_fuzz_examples, isolation=opt.fk_isolation,
                            timeout_s=opt.fk_timeout, e2e_scale=opt.fk_e2e_scale,
                            worker_env=xdist.gpu_env(config) if device == "cuda" else None,
                            journal=on_worker, thorough=opt.fk_thorough)
    except (FileNotFoundError, ValueError) as exc:
        raise pytest.UsageError(str(exc))
    session.record_cpu_benchmarks = opt.fk_benchmark_cpu
    session.remembered_costs = _remembered_costs(device)  # from the cache directory, if any
    if opt.fk_shard or opt.fk_shard_costs:
        from .shard import costs_from_report, parse_shard
        try:
            if not opt.fk_shard:
                raise ValueError("--fk-shard-costs needs --fk-shard=i/N")
            session.shard = parse_shard(opt.fk_shard)
            session.shard_costs = (costs_from_report(opt.fk_shard_costs) if opt.fk_shard_costs
                                   else session.remembered_costs or None)
        except ValueError as exc:
            raise pytest.UsageError(str(exc))
    if on_worker and opt.fk_isolation == "none":  # candidates run in this process (else the worker's)
        if device == "cpu":
            xdist.share_cpu_threads()
        else:
            import torch
            torch.cuda.set_device(xdist.worker_index(config) % torch.cuda.device_count())
    if not on_worker:
        # the terminal reporter registers after this hook: look it up when a line comes
        session.progress_sink = lambda text: _write_line(config, text)
        # harmless without xdist: no report carries a journal then
        config.pluginmanager.register(_JournalMerger(session), "fastkernels-journal-merger")
    config.stash[SESSION_KEY] = session
    _watch_interrupts(config, session)


def _cost_device(device: str) -> str:
    """The key measured costs are kept under: the GPU's name, or "cpu"."""
    if device == "cuda":
        import torch
        return torch.cuda.get_device_name(0)
    return "cpu"


def _remembered_costs(device: str) -> dict:
    from .e2e_cache import cache_dir
    from .shard import remembered_costs
    root = cache_dir()
    return remembered_costs(root, _cost_device(device)) if root else {}


def _watch_interrupts(config, session: FKSession) -> None:
    """Note a SIGINT (Ctrl-C) before Python turns it into KeyboardInterrupt. Code that swallows the
    exception (a finaliser, a broad ``except``) would otherwise let an interrupted run finish and
    write its report as complete; with the note the report says it is not, and the run stops at
    the next test. Only where Python's own handler is in place (an xdist worker ignores SIGINT:
    its controller is the one interrupted), and only from the main thread, as signals require."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        return

    def on_sigint(signum, frame):
        session.interrupted = True
        signal.default_int_handler(signum, frame)  # KeyboardInterrupt, as without the plugin

    signal.signal(signal.SIGINT, on_sigint)
    config.add_cleanup(lambda: signal.signal(signal.SIGINT, signal.default_int_handler))


def _write_line(config, text: str) -> None:
    """A progress line on the terminal now, not in the running test's captured output."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    capman = config.pluginmanager.get_plugin("capturemanager")
    if capman is None:
        reporter.write_line(text)
        return
    with capman.global_and_fixture_disabled():
        reporter.write_line(text)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto`` with CUDA: one worker per visible GPU (each pinned to its own)."""
    if config.option.fk_device in ("auto", "cuda"):
        import torch
        if torch.cuda.is_available():
            return torch.cuda.device_count()
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    fk = item.config.stash.get(SESSION_KEY, None)
    task = getattr(getattr(item, "function", None), "_fk_task", None)
    if fk is not None and task is not None:  # what each task costs a run (the report's "seconds")
        fk.results.add_seconds(task, call.duration, getattr(item.function, "_fk_kind", None),
                               first_phase=call.when == "setup")
    if fk is not None and fk.results.journal is not None:
        from .xdist import attach_journal
        attach_journal(outcome.get_result(), fk.results)


class _JournalMerger:
    """Controller of an xdist run: replays what each worker recorded into the one session."""

    def __init__(self, session: FKSession):
        self.session = session

    @pytest.hookimpl(tryfirst=True)  # before junitxml & co. see the report's user_properties
    def pytest_runtest_logreport(self, report):
        from .xdist import take_journal
        events = take_journal(report)
        if events:
            self.session.results.replay(events)
            self.session.write_progress()


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
        if metafunc.function._fk_kind == "speed":
            # A tensor-parallel case's time is its slowest rank's on one device per rank: not
            # measured yet (fk_pytest.tp_eval scores its correctness).
            from .task import tp_degree
            cases = [c for c in cases if tp_degree(c) == 1]
        ids = [c.id for c in cases]
        if len(set(ids)) != len(ids):
            raise ValueError(f"task {task.name}: duplicate case ids")
        metafunc.parametrize("case", cases, ids=ids)


@pytest.hookimpl(trylast=True)  # after -k / -m have deselected: the shards split what is selected
def pytest_collection_modifyitems(session, config, items):
    fk = config.stash.get(SESSION_KEY, None)
    if fk is None:
        return
    if fk.shard is not None:
        from .shard import split
        kept, dropped = split(items, *fk.shard, costs=fk.shard_costs)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = kept
    from .xdist import worker_id
    if worker_id(config) is not None:
        # The order xdist hands files out in (see pytest_cmdline_main): longest first, so the
        # last file handed out is a short one. Priced by the seconds earlier runs on this device
        # measured (the cache directory's costs.json) when there are any; else the end-to-end file
        # first (few tests, the longest), then the files with the most tests, as xdist's own
        # default does. A stable sort on a per-file key keeps each file's tests together and in
        # order; every worker reads the same file, so every worker collects the same order.
        if fk.remembered_costs:
            from .shard import file_prices
            price = file_prices(items, fk.remembered_costs)
            items.sort(key=lambda item: -price[item.nodeid.split("::")[0]])
        else:
            tests_in = Counter(item.nodeid.split("::")[0] for item in items)
            items.sort(key=lambda item: (getattr(getattr(item, "function", None), "_fk_e2e", None) is None,
                                         -tests_in[item.nodeid.split("::")[0]]))


def pytest_collection_finish(session):
    """Every selected task appears in the report, as NOT_RUN until one of its tests runs."""
    if session.config.option.fk_stubs:
        from .stubs import write_from_session
        return write_from_session(session)  # writes the stubs and deselects every test
    fk = get_session(session.config)
    for item in session.items:
        task = getattr(getattr(item, "function", None), "_fk_task", None)
        if task is not None:
            fk.results.register(task)
        e2e = getattr(getattr(item, "function", None), "_fk_e2e", None)
        if e2e is not None and hasattr(item, "callspec"):
            fk.results.register_e2e(e2e, item.callspec.params["case"])
    _freeze_startup_objects()


def _freeze_startup_objects() -> None:
    """Exempt what imports and collection made (torch, triton, hypothesis, the test items: hundreds
    of thousands of objects that live until exit) from every later cyclic collection. The run's
    explicit full collections (``build.release_memory``: between end-to-end mutants and full-size
    cases) then scan only what the cases made: 0.18 s each in SmolLM2's calibration on a 2-core CPU,
    a dozen per model. Objects made before this point are still freed by their reference counts.
    No collection first: freezing is a constant-time move, a collection here would scan everything
    (in a run started inside a bigger process, its whole heap) on the run's own clock."""
    gc.freeze()


@pytest.fixture(scope="session")
def fk_session(request) -> FKSession:
    return get_session(request.config)


@pytest.fixture
def fk_check(fk_session):
    """Score a kernel class on a task's case with the calibrated check, from any repo's tests.

    ``fk_check("rms_norm", case, MyRMSNorm)`` runs reference, candidate and float64 truth on the
    case's realistic inputs and fails the test with the verdict if the kernel is wrong.
    """
    from .signatures import check_class
    from .correctness import evaluate_case
    from .registry import get_task

    def check(task, case, candidate_cls, seeds: int = 1):
        task = get_task(task) if isinstance(task, str) else task
        check_class(task.reference, candidate_cls)
        results = [evaluate_case(task, case, fk_session.seed_for(case.id, i), candidate_cls, fk_session.device)
                   for i in range(seeds)]
        for r in results:
            if not r.passed:
                pytest.fail(f"{r.status} [{r.case_id}]: {r.message}", pytrace=False)
        return results

    return check


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    fk = item.config.stash.get(SESSION_KEY, None)
    if fk is not None and fk.interrupted:  # a KeyboardInterrupt was swallowed somewhere
        item.session.shouldstop = "interrupted (SIGINT)"
    fn = getattr(item, "function", None)
    if getattr(fn, "_fk_task", None) is not None or getattr(fn, "_fk_e2e", None) is not None:
        get_session(item.config).write_progress()


def pytest_unconfigure(config):
    gc.unfreeze()  # what _freeze_startup_objects exempted is collectable again at exit, as before


def pytest_sessionfinish(session, exitstatus):
    fk = session.config.stash.get(SESSION_KEY, None)
    if fk is None:
        return
    fk.close()
    if fk.results.tasks or fk.results.e2e:
        written = fk.write(complete=exitstatus in (0, 1) and not fk.interrupted)
        _remember_costs(session.config, fk, written)


def _remember_costs(config, fk, report=None) -> None:
    """Leave this run's seconds per task and end-to-end model in the cache directory (the
    controller's merged results, not a worker's share), for the next run's balance."""
    from .e2e_cache import cache_dir
    from .shard import remember_costs
    from .xdist import worker_id
    root = cache_dir()
    if root is None or worker_id(config) is not None:
        return
    try:
        remember_costs(root, _cost_device(fk.device), report or fk.report(complete=True))
    except OSError as exc:  # costs only balance the next run: say so, and go on
        if fk.progress_sink is not None:
            fk.progress_sink(f"could not keep the measured costs in {root}: {exc}")


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
    report = fk.report(complete=True)
    terminalreporter.write_line(format_table(report))
    cpu_timed = any(s["informational"] for t in report["tasks"] for s in t["speed"])
    if cpu_timed and not fk.record_cpu_benchmarks:
        terminalreporter.write_line("CPU timings are the Triton interpreter's wall time (informational, shown "
                                    "as '(x cpu)'); --fk-benchmark-cpu adds them to pytest-benchmark's table")
    if fk.report_path:
        terminalreporter.write_line(f"report: {fk.report_path}")


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_json(config, benchmarks, output_json):
    fk = config.stash.get(SESSION_KEY, None)
    if fk is not None and (fk.results.tasks or fk.results.e2e):
        output_json["fastkernels"] = fk.report(complete=True)
