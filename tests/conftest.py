import contextlib
import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
CANDIDATES = Path(__file__).parent / "candidates"
EXAMPLES = ROOT / "examples" / "candidates" / "triton"
XDIST_ENV = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID")


# Tests that share one expensive module fixture, by node-id prefix: under ``-n`` each group runs on
# one worker, so the fixture is built once, not once per worker. SmolLM2's end-to-end calibration
# (noise runs and every built-in mutant) costs about 170 s on a 2-core machine; the Mixtral cut's,
# through the plugin, 30-60 s; the stub tree's probe of every task's calls on the reference 20-30 s;
# trained all-MiniLM-L6-v2's HF and packed float32 runs about 3 s; the trained DINOv2-S's ONNX read and
# both models' float32 runs on four photos about 3 s; the MiniLM embedding case's calibration (noise runs
# and six mutants) about 3 s; the Mixtral cut's degree-1 calibration for both tensor-parallel trees
# about 1.5 s alone, 3-10 s beside the other worker; the SmolLM2 GGUF file's HF reads about 2 s.
SHARED_FIXTURE_GROUPS = {"tests/test_e2e.py::test_smollm2_": "smollm2-calibration",
                         "tests/test_e2e.py::test_kernel_and_e2e_macroevals_side_by_side": "mixtral-plugin-run",
                         "tests/test_e2e.py::test_the_cache_options_reach_the_evaluator": "mixtral-plugin-run",
                         "tests/test_stubs.py::test_every_task_gets_a_stub_the_suite_accepts": "stub-tree",
                         "tests/test_stubs.py::test_manifest_names_the_tree_and_every_task": "stub-tree",
                         "tests/test_minilm_trained.py::": "minilm-trained",
                         "tests/test_dinov2_trained.py::": "dinov2-trained",
                         "tests/test_embedding_e2e.py::": "minilm-embedding-calibration",
                         "tests/test_e2e_tp.py::": "mixtral-tp-calibration",
                         "tests/test_gguf.py::": "smollm2-gguf"}


def pytest_configure(config):
    """Under ``-n N``, each xdist worker and every process its tests start (the suite's sterile
    workers, suite runs in a process of their own) get one worker's share of the cores. Left at
    every core each, two workers' torch thread pools oversubscribe a 2-core machine: the Mixtral-cut
    runs of test_e2e took 290 s each side by side, 12-20 s with one thread each. A thread count the
    user set (OMP_NUM_THREADS) is kept."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    if not os.environ.get("PYTEST_XDIST_WORKER") or workers < 2:
        return
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))
    if "torch" in sys.modules:  # already imported (by the fastkernels plugin): its pool is sized
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """``-n N`` without another ``--dist``: xdist's load balancing, except that each group above is
    one unit of work. (xdist's own ``xdist_group`` marks do not group under pytest 9, which derives
    a node id from its structured id: the suffix xdist writes into ``_nodeid`` is never read.)"""
    if config.getvalue("dist") != "load" or any(a == "--dist" or a.startswith("--dist=")
                                                for a in config.invocation_params.args):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            for prefix, group in SHARED_FIXTURE_GROUPS.items():
                if nodeid.startswith(prefix):
                    return group
            return nodeid

    return SharedFixtureScheduling(config, log)


def check_candidate_host_syncs(model, label: str, when=None):
    """The modules a candidate tree composed into ``model``, each now run under ``HostSyncCheck``
    (named ``label, class``), so the first operation a CUDA-graph capture cannot run raises; with
    ``when`` (no arguments -> bool) only on the calls it allows. The reference's own modules (their
    CPU paths are not what the GPU captures) are left unchecked."""
    from fk_pytest.host_sync import HostSyncCheck

    checked = [m for m in model.modules() if type(m).__module__.startswith("_fk_candidate")]
    for module in checked:
        def forward(*args, _forward=module.forward, _where=f"{label}, {type(module).__name__}", **kwargs):
            if when is not None and not when():
                return _forward(*args, **kwargs)
            with HostSyncCheck(_where):
                return _forward(*args, **kwargs)
        module.forward = forward
    return checked


def suite_args(args, tasks=True):
    """The command line of a suite run: the task suite on the CPU, with this checkout as root."""
    target = [str(ROOT / "tasks")] if tasks else []
    # pytest-benchmark's own statistics are noise on the CPU; tests that need them opt in.
    quiet = [] if any(a.startswith(("--benchmark-only", "--benchmark-enable")) for a in args) \
        else ["--benchmark-disable"]
    return [*target, "-p", "no:cacheprovider", *quiet, "--fk-device=cpu", f"--rootdir={ROOT}", *args]


def _suite_env():
    """What a suite run started from a test sees: this checkout importable, and not an xdist worker
    when these tests run under xdist."""
    env = {k: v for k, v in os.environ.items() if k not in XDIST_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    return env


class _NoGcAtExit:
    """What pytester's in-process runs do: no full garbage collection at the end of the run.
    pytest collects garbage twice as a run ends, to report exceptions raised in ``__del__``; in
    this process, which holds torch, Triton and every earlier run's modules, that took 0.5 s of
    each run (a collect-only run: 1.1 s in all). A fresh ``pytest`` process is cheap to collect,
    and an exception in a finalizer is still reported when reference counting runs it."""

    @staticmethod
    def pytest_configure(config):
        try:  # pytest's own switch, private and recent (pytest>=8 is all pyproject asks for)
            from _pytest.unraisableexception import gc_collect_iterations_key
        except ImportError:
            return  # an older pytest: the collection stays, only the time is lost
        config.stash[gc_collect_iterations_key] = 0


def run_suite_in_process(args, cwd) -> pytest.RunResult:
    """``pytest`` on the task suite in this process, output captured as pytester's runs capture it.

    The pytest process of a suite run never imports candidate code: the candidates run in its
    sterile worker process (``--fk-isolation=process``, the default), so a crashing or cheating
    candidate cannot disturb this one. Only runs with ``--fk-isolation=none`` need a process of
    their own where the candidate can crash (``suite_run(..., subprocess=True)``).

    Unlike pytester's fixture this works in a fixture of any scope, so tests that check different
    things about one run can share it. The modules a run imports (torch, Triton, hypothesis, the
    task modules: about 6.5 s in a fresh process) stay loaded for the next run; dropping them, as
    pytester does, would import them again, and C extensions do not survive that. What a run
    replaces is put back: the module named ``conftest`` (the suite's root conftest takes the name
    of this one), sys.path, the working folder, the environment (the plugin exports
    --fk-cache-dir to its workers through it) and the guards' record of the genuine functions (a
    run with ``--fk-isolation=none`` takes it in this process; left behind, it turns every later
    test here that monkeypatches an fk_pytest function into a TAMPERED verdict)."""
    from fk_pytest import guards

    modules, path, environ = dict(sys.modules), list(sys.path), dict(os.environ)
    genuine = dict(guards._GENUINE)
    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    started = time.monotonic()
    os.environ.clear()
    os.environ.update(_suite_env())
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            # The suite's packages (kernels_reference, ...) belong to the plugin's distribution,
            # which pytest marks for assertion rewriting: in this process an earlier run (or
            # test) imported them already, and pytest warns that it cannot rewrite them, a
            # warning that a fresh pytest process never gives.
            ret = pytest.main([*map(str, args), "-W", "ignore::pytest.PytestAssertRewriteWarning"],
                              plugins=[_NoGcAtExit()])
    finally:
        os.chdir(here)
        sys.modules.update(modules)
        sys.path[:] = path
        os.environ.clear()
        os.environ.update(environ)
        guards._GENUINE.clear()
        guards._GENUINE.update(genuine)
    return pytest.RunResult(ret, out.getvalue().splitlines(), err.getvalue().splitlines(),
                            time.monotonic() - started)


def run_suite_subprocess(args, cwd, timeout=900) -> pytest.RunResult:
    """The same run in a ``python -m pytest`` process of its own."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", *map(str, args)], cwd=cwd, env=_suite_env(),
                          capture_output=True, text=True, timeout=timeout)
    return pytest.RunResult(done.returncode, done.stdout.splitlines(), done.stderr.splitlines(),
                            time.monotonic() - started)


@pytest.fixture
def suite_run(tmp_path):
    """Run the task suite as a user does, and return a RunResult as pytester's runs do.

    In this process by default (see run_suite_in_process); ``subprocess=True`` for a run whose
    candidate code runs in the pytest process itself and may end it (``--fk-isolation=none``).
    Not built on the pytester fixture: at its teardown it drops the modules imported during the
    test, and Triton's C extension aborts the process when it is imported a second time."""
    def run(*args, tasks=True, timeout=900, subprocess=False):
        cwd = tmp_path / "suite_run"
        cwd.mkdir(exist_ok=True)
        argv = suite_args(args, tasks)
        if subprocess:
            return run_suite_subprocess(argv, cwd, timeout)
        return run_suite_in_process(argv, cwd)

    return run
