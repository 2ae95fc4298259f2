"""The calibrated comparison itself."""
import pytest
import torch

from fk_pytest.compare import ABS_FLOOR, check_discriminating, output_error, represent
from fk_pytest.errors import TaskDefinitionError


def _truth(shape=(64, 512)):
    return torch.randn(shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_rounded_truth_is_at_the_floor_and_passes(dtype):
    t = _truth()
    e = output_error("out", t, t.to(dtype), t.to(dtype), dtype)
    assert e.ratio <= 1.0 and e.passed(2.0)
    assert e.floor >= ABS_FLOOR.get(dtype, 0.0)


def test_bf16_error_on_a_float32_output_fails():
    t = _truth()
    e = output_error("out", t, t.float(), t.to(torch.bfloat16).float(), torch.float32)
    assert e.ratio > 100 and not e.passed(2.0)


def test_a_few_wrong_elements_fail_the_per_element_view():
    t = _truth((512, 512))
    cand = t.to(torch.bfloat16)
    cand[3, 7] += 1.0  # one element off: invisible in the L2 norm of 262k elements
    e = output_error("out", t, t.to(torch.bfloat16), cand, torch.bfloat16)
    assert e.ratio < 2.0 and e.elem_ratio > 4.0 and not e.passed(2.0)


def test_truncation_floor_is_about_twice_rounding():
    t = _truth()
    rounded = float((represent(t, torch.bfloat16) - t).norm() / t.norm())
    truncated = float((represent(t, torch.bfloat16, truncating=True) - t).norm() / t.norm())
    assert 1.6 < truncated / rounded < 2.6


@pytest.mark.parametrize("bad", [torch.zeros(4, 8), torch.full((4, 8), 3.0)])
def test_degenerate_truth_is_refused(bad):
    with pytest.raises(TaskDefinitionError, match="degenerate"):
        check_discriminating("out", bad.double())
    check_discriminating("out", _truth())  # a real one is accepted


def test_a_reference_that_misses_its_own_truth_is_refused():
    from fk_pytest.compare import REFERENCE_SUSPECT, check_reference_errors, reference_suspect

    assert not reference_suspect([(0.004, 0.1), (REFERENCE_SUSPECT, 3.0)])
    assert reference_suspect([(0.004, 0.1), (float("nan"), 3.0)])
    # imprecise, or as imprecise as its native form: fine
    check_reference_errors(["out", "residual"], [(0.004, 0.1), (0.09, 3.0)], [(0.004, 0.1), (0.092, 3.0)])
    for broken in (0.87, float("nan"), float("inf")):
        with pytest.raises(TaskDefinitionError, match="'residual' is .*the reference is broken on this case"):
            check_reference_errors(["out", "residual"], [(0.004, 0.1), (broken, 40.0)], [(0.004, 0.1), (0.003, 0.1)])


def _rms_norm_case_with(monkeypatch, method, factor):
    """rms_norm's first CPU case with the reference class's ``method`` off by ``factor`` at the case
    dtype (never in the float64 truth)."""
    from fk_pytest.registry import get_task

    task = get_task("rms_norm")
    cls = task.reference
    real = getattr(cls, method)

    def off(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        if self.weight.dtype == torch.float64:
            return out
        return tuple(o * factor for o in out) if isinstance(out, tuple) else out * factor

    monkeypatch.setattr(cls, method, off)
    return task, task.cases("cpu")[0], cls


def test_a_case_whose_reference_is_broken_is_a_task_error_not_a_pass(monkeypatch):
    """The reference's forward at the case dtype returns twice the right value, as a GPU-only fast
    path that faults would, while its native form is right: the case is refused."""
    from fk_pytest.correctness import evaluate_case
    task, case, cls = _rms_norm_case_with(monkeypatch, "forward", 2.0)
    with pytest.raises(TaskDefinitionError, match="the reference is broken on this case"):
        evaluate_case(task, case, 5, cls, "cpu")


def test_a_reference_as_imprecise_as_its_native_form_is_scored(monkeypatch):
    """5% off in the native form itself (which the fast path runs on the CPU): imprecise, not
    broken; the case is scored as usual."""
    from fk_pytest.correctness import evaluate_case
    task, case, cls = _rms_norm_case_with(monkeypatch, "forward_native", 1.05)
    result = evaluate_case(task, case, 5, cls, "cpu")
    assert result.passed, result.message
