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
