"""How often a verdict runs the reference: once per input draw, also where the MoE rule for
undetermined rows reads the reference's router logits (it once ran a copy of its own)."""
import torch

from fk_pytest.correctness import evaluate_case
from fk_pytest.registry import get_task


def _forward_calls_at(task, case, monkeypatch):
    """Calls of the reference class's ``forward`` on a module at the case dtype (the truth runs
    ``forward_native`` in float64 and is not counted)."""
    cls = task.reference
    calls = []
    real = cls.forward

    def counted(self, *args, **kwargs):
        if next(self.parameters()).dtype == case.dtype:
            calls.append(1)
        return real(self, *args, **kwargs)
    monkeypatch.setattr(cls, "forward", counted)
    result = evaluate_case(task, case, 5, cls, "cpu")
    return result, len(calls)


def test_an_moe_layer_runs_its_reference_once_per_case_draw_plus_the_candidate(monkeypatch):
    task = get_task("mixtral_decoder_layer")
    case = task.cases("cpu")[0]
    result, calls = _forward_calls_at(task, case, monkeypatch)
    assert result.passed, result.message
    assert result.reference == "run"
    # The candidate is the reference class here, so it is one of the calls: reference + candidate.
    assert calls == 2, calls


def test_a_dense_task_runs_its_reference_once_per_case_draw_plus_the_candidate(monkeypatch):
    task = get_task("llama_decoder_layer")
    case = task.cases("cpu")[0]
    result, calls = _forward_calls_at(task, case, monkeypatch)
    assert result.passed, result.message
    assert calls == 2, calls
