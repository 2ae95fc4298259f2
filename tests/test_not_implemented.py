"""NOT_IMPLEMENTED: a stub is still to do, not a crash and not an absent module.

A class whose ``forward`` only raises NotImplementedError is known from its source when it is
loaded (no input is built for it); a forward that raises NotImplementedError on some calls only
makes those cases NOT_IMPLEMENTED, and a real failure beside them still names the task's verdict.
"""
import json
import time

import pytest

from fk_pytest import status
from fk_pytest.errors import CandidateError
from fk_pytest.signatures import check_class, only_raises_not_implemented
from kernels_reference.L1.rms_norm import RMSNorm as ReferenceRMSNorm
from test_plugin import write_tree

RMS_INIT = """
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps
"""
STUB_RMS = "import torch\n\nclass RMSNorm(torch.nn.Module):" + RMS_INIT + '''
    def forward(self, x, residual=None):
        """Normalise x (or x + residual)."""
        raise NotImplementedError("RMSNorm.forward: write the kernel")
'''
HONEST_RMS = "import torch\n\nclass RMSNorm(torch.nn.Module):" + RMS_INIT + '''
    def forward(self, x, residual=None):
        if residual is not None:
            x = x + residual
            residual = x
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        out = (h * self.weight.float()).to(x.dtype)
        return out if residual is None else (out, residual)
'''
# Right where it is written (one token), NotImplementedError for every other call.
PARTIAL_SILU = """
import torch

class SiluAndMul(torch.nn.Module):
    def forward(self, x):
        if x.shape[0] != 1:
            raise NotImplementedError("only one token so far")
        d = x.shape[-1] // 2
        return torch.nn.functional.silu(x[..., :d]) * x[..., d:]
"""
# Not implemented for one token, wrong (off by a factor) everywhere else: WRONG, not unwritten.
PARTIAL_AND_WRONG_SILU = """
import torch

class SiluAndMul(torch.nn.Module):
    def forward(self, x):
        if x.shape[0] == 1:
            raise NotImplementedError
        d = x.shape[-1] // 2
        return 1.1 * torch.nn.functional.silu(x[..., :d]) * x[..., d:]
"""


@pytest.mark.parametrize("body, stub", [
    ("def forward(self, x):\n    raise NotImplementedError\n", True),
    ("def forward(self, x):\n    '''doc'''\n    raise NotImplementedError('later')\n", True),
    ("def forward(self, x):\n    if x is None:\n        raise NotImplementedError\n    return x\n", False),
    ("def forward(self, x):\n    raise ValueError('no')\n", False),
    ("def forward(self, x):\n    pass\n", False),
    ("def forward(self, x):\n    return x\n", False),
])
def test_stub_forward_is_recognised_from_its_source(tmp_path, body, stub):
    path = tmp_path / "m.py"
    path.write_text(body)
    scope = {}
    exec(compile(body, str(path), "exec"), scope)  # a real file, so inspect can read the source
    assert only_raises_not_implemented(scope["forward"]) is stub


def test_no_source_is_not_a_stub():
    assert only_raises_not_implemented(len) is False  # built in: run it rather than guess


def test_check_class_names_the_stub(tmp_path):
    path = tmp_path / "stub_rms.py"
    path.write_text(STUB_RMS)
    scope = {}
    exec(compile(STUB_RMS, str(path), "exec"), scope)
    with pytest.raises(CandidateError) as err:
        check_class(ReferenceRMSNorm, scope["RMSNorm"])
    assert err.value.status == status.NOT_IMPLEMENTED and "RMSNorm.forward" in err.value.message


def _run(suite_run, tmp_path, files, select):
    tree = write_tree(tmp_path / "tree", files)
    report = tmp_path / "r.json"
    started = time.monotonic()
    result = suite_run("-k", select, f"--fk-candidate={tree}", f"--fk-report={report}", "-p", "no:randomly")
    seconds = time.monotonic() - started
    tasks = {t["name"]: t for t in json.loads(report.read_text())["tasks"]}
    return result, tasks, seconds


def test_stub_and_partial_candidates_are_not_implemented_not_crashes(suite_run, tmp_path):
    result, tasks, _ = _run(suite_run, tmp_path, {"L1/rms_norm.py": STUB_RMS, "L1/silu_and_mul.py": PARTIAL_SILU},
                                 "(rms_norm or silu_and_mul) and (T1- or T7- or fuzz)")
    assert result.ret == 0, result.stdout.str()[-3000:]  # xfails: still to do, the run is not broken
    outcomes = result.parseoutcomes()
    assert outcomes.get("xfailed", 0) > 0 and outcomes.get("failed", 0) == 0
    rms, silu = tasks["rms_norm"], tasks["silu_and_mul"]
    assert rms["status"] == status.NOT_IMPLEMENTED and rms["cases_total"] == 0  # known before any input
    assert "only raises NotImplementedError" in rms["message"] and not rms["valid"]
    assert silu["status"] == status.NOT_IMPLEMENTED and not silu["valid"]
    by_status = {c["status"] for c in silu["cases"]}
    assert by_status == {status.PASSED, status.NOT_IMPLEMENTED}  # the one-token cases it wrote pass
    assert 0 < silu["C_t"] < 1 and "only one token so far" in silu["message"]
    result.stdout.fnmatch_lines(["*rms_norm*NOT_IMPLEMENTED*", "*silu_and_mul*NOT_IMPLEMENTED*"])


def test_a_real_failure_outranks_not_implemented(suite_run, tmp_path):
    result, tasks, _ = _run(suite_run, tmp_path, {"L1/silu_and_mul.py": PARTIAL_AND_WRONG_SILU},
                            "silu_and_mul and correctness and (T1- or T7-)")
    assert result.ret == 1  # wrong somewhere: a failure, not an xfail
    silu = tasks["silu_and_mul"]
    assert silu["status"] == status.WRONG_RESULT
    assert {c["status"] for c in silu["cases"]} == {status.WRONG_RESULT, status.NOT_IMPLEMENTED}


def test_filling_the_stub_passes_and_a_stub_costs_no_evaluation(suite_run, tmp_path):
    select = "rms_norm and (decode-T1- or fuzz)"
    _, stub_tasks, stub_s = _run(suite_run, tmp_path / "a", {"L1/rms_norm.py": STUB_RMS}, select)
    result, tasks, filled_s = _run(suite_run, tmp_path / "b", {"L1/rms_norm.py": HONEST_RMS}, select)
    assert result.ret == 0 and tasks["rms_norm"]["status"] == status.PASSED and tasks["rms_norm"]["valid"]
    assert stub_tasks["rms_norm"]["status"] == status.NOT_IMPLEMENTED
    # The stub's run is collection plus one worker start; the filled one evaluates every case.
    assert stub_s < filled_s, (stub_s, filled_s)


def test_composed_parent_keeps_the_reference_for_a_stub_child():
    from fk_pytest.compose import candidate_lookup

    class Source:  # the tree provides RMSNorm, but only as a stub
        def load(self, path, ref_cls):
            raise CandidateError(status.NOT_IMPLEMENTED, "RMSNorm.forward only raises NotImplementedError")

    assert candidate_lookup(Source())(ReferenceRMSNorm) is None  # no failure: the parent is scored
