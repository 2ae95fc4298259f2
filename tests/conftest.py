import os
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
CANDIDATES = Path(__file__).parent / "candidates"
EXAMPLES = ROOT / "examples" / "candidates" / "triton"


# Tests that share one expensive module fixture, by node-id prefix: under ``-n`` each group runs on
# one worker, so the fixture is built once, not once per worker. SmolLM2's end-to-end calibration
# (noise runs and every built-in mutant) costs about 170 s on a 2-core machine.
SHARED_FIXTURE_GROUPS = {"tests/test_e2e.py::test_smollm2_": "smollm2-calibration"}


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


@pytest.fixture
def suite_run(pytester, monkeypatch):
    """Run the task suite in a subprocess (a crash or a Triton kernel cannot disturb this one)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    # When these tests run under xdist, the suite run they start is not an xdist worker.
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)

    def run(*args, tasks=True, timeout=900):
        target = [str(ROOT / "tasks")] if tasks else []
        # pytest-benchmark's own statistics are noise on the CPU; tests that need them opt in.
        quiet = [] if any(a.startswith(("--benchmark-only", "--benchmark-enable")) for a in args) \
            else ["--benchmark-disable"]
        return pytester.runpytest_subprocess(
            *target, "-p", "no:cacheprovider", *quiet, "--fk-device=cpu",
            f"--rootdir={ROOT}", *args, timeout=timeout)

    return run
