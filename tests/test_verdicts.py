"""Verdicts: honest candidates pass every case, wrong ones fail with the right status.

These drive the same `evaluate_case` the standard tests use, over each task's CPU workload cases
(one input draw each), so they prove the *cases and checks* catch each bug, not a test tuned to it.
"""
from collections import Counter

import torch

import pytest

from fk_pytest import status
from fk_pytest.candidates import CandidateSource
from fk_pytest.correctness import evaluate_case
from fk_pytest.errors import short_traceback
from fk_pytest.registry import get_task

from conftest import CANDIDATES, EXAMPLES, ROOT


def verdicts(task_name, cls, cases=None):
    task = get_task(task_name)
    results = [evaluate_case(task, case, 1234, cls, "cpu") for case in (cases or task.cases("cpu"))]
    return Counter(r.status for r in results), results


def load(tree, task_name):
    return CandidateSource(tree).load_class(get_task(task_name))


def assert_passes_every_case(task_name, tree):
    """The honest candidate ``tree`` passes every CPU case of ``task_name``."""
    counts, results = verdicts(task_name, load(tree, task_name))
    assert counts == {status.PASSED: len(results)}, [r.message for r in results if not r.passed][:3]


def assert_fails_exactly(task_name, tree, failing, some_pass=False):
    """The wrong candidate ``tree`` is WRONG_RESULT on exactly the CPU cases ``failing(case)``
    names (at least one; with ``some_pass``, not all) and passes the others."""
    cases = get_task(task_name).cases("cpu")
    counts, results = verdicts(task_name, load(CANDIDATES / tree, task_name), cases)
    expected = {c.id for c in cases if failing(c)}
    assert expected and (not some_pass or len(expected) < len(cases))
    assert {r.case_id for r in results if not r.passed} == expected, counts
    assert {r.status for r in results if not r.passed} == {status.WRONG_RESULT}


@pytest.mark.parametrize("task_name", ["rms_norm", "gemma_rms_norm", "silu_and_mul", "rotary_emb",
                                       "qwen3_next_attention"])
@pytest.mark.parametrize("tree", [EXAMPLES, ROOT / "kernels_reference"], ids=["examples-triton", "reference-tree"])
def test_honest_candidates_pass_every_case(task_name, tree):
    assert_passes_every_case(task_name, tree)


@pytest.mark.parametrize("tree, task_name, expected, where", [
    ("rms_old_residual", "rms_norm", status.WRONG_RESULT, "fused-add"),
    ("silu_swapped", "silu_and_mul", status.WRONG_RESULT, ""),
    ("rope_wrong_style", "rotary_emb", status.WRONG_RESULT, ""),
    ("rope_ignores_positions", "rotary_emb", status.WRONG_RESULT, "decode"),
    ("rope_no_positions", "rotary_emb", status.WRONG_RESULT, "decode"),
    ("rms_width_4096", "rms_norm", status.WRONG_RESULT, "qwen2.5"),
    ("rms_contiguous_rows", "rms_norm", status.WRONG_RESULT, "norm-"),
    ("rms_low_precision", "rms_norm", status.WRONG_RESULT, "fp32"),
    ("gemma_no_unit_offset", "gemma_rms_norm", status.WRONG_RESULT, "q-norm"),
    ("qwen3_next_gate_halves", "qwen3_next_attention", status.WRONG_RESULT, "decode"),
    ("qwen3_next_ungated_shared", "qwen3_next_moe_block", status.WRONG_RESULT, "qwen3-next"),
    ("attn_no_context", "attention", status.WRONG_RESULT, "decode"),
    ("attn_no_store", "attention", status.WRONG_RESULT, "prefill"),
])
def test_wrong_candidates_fail(tree, task_name, expected, where):
    # Only the cases the bug is expected on (every case where that is not narrowed): the interpreted
    # Triton trees take seconds a case, and the cases where such a tree is right are checked apart.
    cases = [c for c in get_task(task_name).cases("cpu") if where in c.id]
    counts, results = verdicts(task_name, load(CANDIDATES / tree, task_name), cases)
    failing = [r for r in results if not r.passed]
    assert failing, f"{tree} passed every case"
    assert {r.status for r in failing} == {expected}
    assert any(where in r.case_id for r in failing), [r.case_id for r in failing]


def test_width_4096_passes_where_it_happens_to_be_right():
    """The hard-coded kernel is right on 4096-wide rows: only other widths expose it."""
    cls = load(CANDIDATES / "rms_width_4096", "rms_norm")
    task = get_task("rms_norm")
    llama = [c for c in task.cases("cpu") if c.model == "llama-3.1-8b" and c.dtype.is_floating_point
             and c["layout"] == "contiguous" and c.dtype != torch.float32]
    counts, _ = verdicts("rms_norm", cls, llama)
    assert counts == {status.PASSED: len(llama)}


def test_contiguous_rows_kernel_is_right_on_packed_rows():
    cls = load(CANDIDATES / "rms_contiguous_rows", "rms_norm")
    packed = [c for c in get_task("rms_norm").cases("cpu") if c["layout"] == "contiguous"]
    counts, _ = verdicts("rms_norm", cls, packed)
    assert counts == {status.PASSED: len(packed)}


@pytest.mark.parametrize("dtype, tree, key, right_where", [(torch.bfloat16, "rms_contiguous_rows", "layout", "contiguous"),
                                                            (torch.float32, "rms_stale_residual", "variant", "plain")])
def test_the_interpreted_reference_runs_only_for_a_candidate_over_the_plain_bar(monkeypatch, dtype, tree, key,
                                                                              right_where):
    """On the CPU a bf16 or float32 bar also counts the reference's own Triton path run in the
    interpreter (its truncating bf16 conversions, its float32 summation order); a bar is the worst
    of the reference's errors, so that run can only raise it and is made only for a candidate over
    the bar without it: none for the cases a Triton tree gets right, one per case it gets wrong
    (strided rows for the packed-rows kernel, the fused add for the stale residual), and those
    still fail."""
    import fk_pytest.correctness as correctness

    made, real = [], correctness.with_paths
    monkeypatch.setattr(correctness, "with_paths", lambda *a, **k: made.append(1) or real(*a, **k))
    cls = load(CANDIDATES / tree, "rms_norm")
    typed = [c for c in get_task("rms_norm").cases("cpu") if c.dtype == dtype]
    right = [c for c in typed if c[key] == right_where][:2]
    wrong = [c for c in typed if c[key] != right_where][:3]
    assert right and wrong
    counts, _ = verdicts("rms_norm", cls, right)
    assert counts == {status.PASSED: len(right)} and made == []
    counts, results = verdicts("rms_norm", cls, wrong)
    assert counts[status.WRONG_RESULT] >= 1 and len(made) == counts[status.WRONG_RESULT], (counts, made)


def test_an_error_inside_torch_names_the_line_of_user_code_that_led_there():
    def candidate_line():
        return torch.zeros(4).split([5])  # raises inside torch's own Python code

    with pytest.raises(RuntimeError) as info:
        candidate_line()
    text = short_traceback(info.value)
    assert text.startswith("RuntimeError: ")
    assert "torch" in text.split(" (at ")[1].split(",")[0]  # the innermost frame is torch's
    assert f"from {__file__}:" in text and "split([5])" in text
