"""RMSNormGated: the reference's Triton kernel (interpreted) against its native definition, and the
task's verdicts on an honest candidate and two wrong ones."""
import pytest
import torch
from hypothesis import given, settings

from fk_pytest import status
from fk_pytest.candidates import CandidateSource
from fk_pytest.correctness import evaluate_case
from fk_pytest.registry import get_task

from conftest import CANDIDATES, EXAMPLES

triton = pytest.importorskip("triton")


@pytest.mark.parametrize("hidden, group_size", [(128, None), (640, 80), (1280, 640), (96, 32)])
@pytest.mark.parametrize("norm_before_gate", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_matches_native(monkeypatch, hidden, group_size, norm_before_gate, dtype):
    from kernels_reference.L1.rms_norm_gated import RMSNormGated

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    gen = torch.Generator().manual_seed(hidden)
    norm = RMSNormGated(hidden, eps=1e-6, group_size=group_size, norm_before_gate=norm_before_gate)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(hidden, generator=gen))
    norm = norm.to(dtype)
    x = torch.randn(3, 11, hidden, generator=gen).to(dtype)  # 33 rows: a partial row tile
    z = torch.randn(3, 11, hidden + 40, generator=gen).to(dtype)[..., 8: 8 + hidden]  # strided gate
    tol = 2e-6 if dtype == torch.float32 else 1e-2
    for gate in (z, None):
        got, want = norm.forward_triton(x, gate), norm.forward_native(x, gate)
        assert got.shape == x.shape and got.dtype == dtype
        torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


def _load(tree):
    return CandidateSource(tree).load_class(get_task("rms_norm_gated"))


def _workload_verdicts(tree):
    task = get_task("rms_norm_gated")
    cls = _load(tree)
    return [evaluate_case(task, case, 1234, cls, "cpu") for case in task.cases("cpu")]


def test_example_candidate_passes_every_case():
    results = _workload_verdicts(EXAMPLES)
    assert all(r.passed for r in results), [r.message for r in results if not r.passed][:3]


def test_gate_on_the_wrong_side_fails_every_case():
    results = _workload_verdicts(CANDIDATES / "gated_norm_gate_order")
    assert {r.status for r in results} == {status.WRONG_RESULT}
    assert {r.case_id.split("-")[0] for r in results} == {"qwen3", "mamba2"}  # both gate orders


def test_whole_row_norm_passes_one_group_rows_and_fails_every_fuzzed_grouping():
    """Both real models have one group per row, where a whole-row norm is right; every fuzzed case
    has 2-8 groups per row, where it is wrong."""
    assert all(r.passed for r in _workload_verdicts(CANDIDATES / "gated_norm_whole_row"))
    task, cls = get_task("rms_norm_gated"), _load(CANDIDATES / "gated_norm_whole_row")

    @settings(max_examples=4, derandomize=True, database=None, deadline=None)
    @given(task.fuzz_strategy(torch.bfloat16, "cpu"))
    def fuzzed(case):
        assert case["hidden"] // case["group_size"] >= 2
        result = evaluate_case(task, case, 1, cls, "cpu", kind="fuzz")
        assert result.status == status.WRONG_RESULT, (case.id, result.message)

    fuzzed()
