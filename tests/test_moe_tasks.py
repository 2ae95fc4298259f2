"""MoE tasks: routing-aware correctness (tasks/moe.py through Task.undetermined_rows) and composed
mode reaching FusedMoE from every MoE task (L2..L4).

Routing: an honest candidate whose router GEMM sums in another order passes every CPU case over
several draws, with near-tied tokens left out; a candidate that routes every token
to the wrong experts still fails every case; a draw with too much left out is a task error.
"""
import importlib
import json
from collections import Counter

import pytest
import torch

from fk_pytest import status
from fk_pytest.candidates import CandidateSource
from fk_pytest.correctness import evaluate_case
from fk_pytest.errors import TaskDefinitionError
from fk_pytest.task import Case

from conftest import CANDIDATES


def task_of(module):  # this checkout's task modules (an installed fk_tasks may be another tree)
    return importlib.import_module(f"tasks.{module}").TASK


QWEN_BLOCK = "L2.test_qwen3_moe_block"


SEEDS = (1234, 1, 2, 3)


def verdicts(task, cls, cases=None):
    results = [evaluate_case(task, case, seed, cls, "cpu") for case in (cases or task.cases("cpu"))
               for seed in SEEDS]
    return Counter(r.status for r in results), results


def test_honest_split_k_router_passes_with_routing_exclusion():
    task = task_of(QWEN_BLOCK)
    cls = CandidateSource(CANDIDATES / "moe_gate_split").load_class(task)
    counts, results = verdicts(task, cls)
    assert counts == {status.PASSED: len(results)}, [r.message for r in results if not r.passed][:3]
    assert any(r.excluded.get("out", 0) > 0 for r in results)  # the rule did leave tokens out


def test_candidate_routing_every_token_wrongly_fails_every_case():
    task = task_of(QWEN_BLOCK)
    cls = CandidateSource(CANDIDATES / "moe_misrouted").load_class(task)
    counts, results = verdicts(task, cls)
    assert counts == {status.WRONG_RESULT: len(results)}, counts
    assert all("undetermined rows left out" in r.message for r in results)


def test_undetermined_tokens_rule():
    from tasks.moe import undetermined_tokens

    logits = torch.tensor([[3.0, 2.0, 2.0 + 1e-3, -1.0],   # 2nd and 3rd within bf16 rounding
                           [3.0, 2.0, 1.0, -1.0]], dtype=torch.float64)
    assert undetermined_tokens(logits, 2, torch.bfloat16).tolist() == [True, False]
    assert undetermined_tokens(logits, 2, torch.float32).tolist() == [False, False]
    assert undetermined_tokens(logits, 4, torch.bfloat16).tolist() == [False, False]  # k = E: no choice


def test_too_much_left_out_is_a_task_error_after_redraws():
    task = task_of(QWEN_BLOCK)
    draws = []

    class AllUndetermined(type(task)):
        def undetermined_rows(self, case, inputs, truth_module):
            draws.append(inputs["hidden_states"].sum().item())
            return lambda: {"out": torch.ones(inputs["hidden_states"].shape[0], dtype=torch.bool)}

    case = next(c for c in task.cases("cpu") if "decode-T5" in c.id)
    with pytest.raises(TaskDefinitionError, match="cannot be scored"):
        evaluate_case(AllUndetermined(), case, 1, task.reference, "cpu")
    assert len(draws) == task.exclusion_redraws + 1 and len(set(draws)) == len(draws)  # new inputs each time


# ---- composed mode: FusedMoE reached from every MoE task ------------------------------------------
MOE_TASKS = ("mixtral_moe", "qwen3_moe_block", "deepseek_v2_moe", "mixtral_decoder_layer",
             "qwen3_moe_decoder_layer", "mixtral_for_causal_lm", "qwen3_moe_for_causal_lm",
             "deepseek_v2_decoder_layer", "deepseek_v2_for_causal_lm")
SELECT = ["-k", "correctness and (decode-T5 or decode-B3) and (moe or mixtral or deepseek_v2_decoder "
                "or deepseek_v2_for)"]


def _composed(suite_run, tmp_path, tree):
    report = tmp_path / "r.json"
    result = suite_run(*SELECT, f"--fk-candidate={CANDIDATES / tree}", "--fk-mode=composed",
                       f"--fk-report={report}")
    return result, {t["name"]: t for t in json.loads(report.read_text())["tasks"]}


def test_honest_fused_moe_is_composed_into_every_moe_task(suite_run, tmp_path):
    result, tasks = _composed(suite_run, tmp_path, "moe_sorted_honest")
    assert result.ret == 0, result.stdout.str()[-2000:]
    assert {t: tasks[t]["status"] for t in MOE_TASKS} == dict.fromkeys(MOE_TASKS, "PASSED")
    assert all(tasks[t]["swapped_modules"] == ["FusedMoE"] for t in MOE_TASKS)


def test_wrong_fused_moe_fails_every_moe_task(suite_run, tmp_path):
    result, tasks = _composed(suite_run, tmp_path, "moe_gate_up_swapped")
    assert result.ret == 1
    assert {t: tasks[t]["status"] for t in MOE_TASKS} == dict.fromkeys(MOE_TASKS, "WRONG_RESULT")
    assert all(tasks[t]["swapped_modules"] == ["FusedMoE"] for t in MOE_TASKS)
