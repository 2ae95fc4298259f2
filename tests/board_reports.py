"""Three real reports for the leaderboard's tests: the reference, the example tree and a stub tree.

Made once per test session (under xdist, once for all workers: the first one to come writes them
under the session's shared temporary folder while the others wait on a lock), by running the task
suite as a user would (in this process: tests/conftest.py, run_suite_in_process), on one small real
case of two L1 tasks.
"""
import os
import textwrap

import pytest
from filelock import FileLock

from conftest import EXAMPLES, run_suite_in_process, suite_args

SELECTION = "(rms_norm or silu_and_mul) and llama-3.1-8b-decode-T1-bf16"

# A tree such as an agent starts from: the module and the class are there, the kernel is not.
STUB_RMS_NORM = '''
import torch


class RMSNorm(torch.nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.hidden_size = hidden_size
        self.variance_epsilon = eps
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))

    def forward(self, x, residual=None):
        raise NotImplementedError("RMSNorm.forward: write the kernel here")
'''


def _run_suite(out, name, *args):
    result = run_suite_in_process(suite_args(
        ["-q", "-p", "no:randomly", "-k", SELECTION, f"--fk-report={out / (name + '.json')}",
         f"--fk-html={out / (name + '.html')}", *args]), out)
    log = "\n".join(result.outlines + result.errlines)
    assert (out / f"{name}.json").is_file(), log[-6000:]
    (out / f"{name}.log").write_text(log)


@pytest.fixture(scope="session")
def board_reports(tmp_path_factory):
    """{"reference", "example", "stub"} -> report path (each with an --fk-html page next to it)."""
    base = tmp_path_factory.getbasetemp()
    # an xdist worker's base is one folder of this session's; without xdist it is the session's own
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "fk-board-reports"
    shared.mkdir(exist_ok=True)
    with FileLock(str(shared) + ".lock"):
        if not (shared / "done").exists():
            stub = shared / "stub_tree" / "L1" / "rms_norm.py"
            stub.parent.mkdir(parents=True, exist_ok=True)
            stub.write_text(textwrap.dedent(STUB_RMS_NORM))
            _run_suite(shared, "reference")
            _run_suite(shared, "example", f"--fk-candidate={EXAMPLES}")
            _run_suite(shared, "stub", f"--fk-candidate={shared / 'stub_tree'}")
            (shared / "done").write_text("")
    return {name: shared / f"{name}.json" for name in ("reference", "example", "stub")}
