import os
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
CANDIDATES = Path(__file__).parent / "candidates"
EXAMPLES = ROOT / "examples" / "candidates" / "triton"


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
