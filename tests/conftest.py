import os
import sys
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

    def run(*args, tasks=True, timeout=900):
        target = [str(ROOT / "tasks")] if tasks else []
        return pytester.runpytest_subprocess(
            *target, "-p", "no:cacheprovider", "--benchmark-disable", "--fk-device=cpu",
            f"--rootdir={ROOT}", *args, timeout=timeout)

    return run
