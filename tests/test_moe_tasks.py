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
        def undetermined_rows(self, case, inputs, truth_module, reference=None):
            draws.append(inputs["hidden_states"].sum().item())
            return lambda: {"out": torch.ones(inputs["hidden_states"].shape[0], dtype=torch.bool)}

    case = next(c for c in task.cases("cpu") if "decode-T5" in c.id)
    with pytest.raises(TaskDefinitionError, match="cannot be scored"):
        evaluate_case(AllUndetermined(), case, 1, task.reference, "cpu")
    assert len(draws) == task.exclusion_redraws + 1 and len(set(draws)) == len(draws)  # new inputs each time


# ---- composed mode: FusedMoE reached from every MoE block and model -------------------------------
# The decoder layers (L3) are left out: each L4 model reaches FusedMoE through them, and their two
# runs cost 18 s of the test command's worker time.
MOE_TASKS = ("mixtral_moe", "qwen3_moe_block", "deepseek_v2_moe", "mixtral_for_causal_lm", "qwen3_moe_for_causal_lm",
             "deepseek_v2_for_causal_lm")
SELECT = ["-k", "correctness and (decode-T5 or decode-B3) and (moe or mixtral or deepseek_v2_for) "
                "and not decoder_layer"]


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


# ---- memory: what a case builds is freed with it, without waiting for the cyclic collector --------
# On the H200 a float64 truth copy of a full-size MoE layer is 2-11 GB; held by a reference cycle it
# outlived its case until the GPU ran out of memory (docs/perf/h200-moe-tasks.md, run 1).

def test_router_recorder_keeps_no_reference_cycle():
    import gc
    import weakref

    from kernels_reference.L1.fused_moe import FusedMoE
    from tasks.moe import RouterLogits

    layer = FusedMoE(num_experts=4, top_k=2, hidden_size=8, intermediate_size=4)
    torch.nn.init.normal_(layer.w13_weight)
    torch.nn.init.normal_(layer.w2_weight)
    x, logits = torch.randn(3, 8), torch.randn(3, 4)
    gc.disable()
    try:
        recorder = RouterLogits(layer)
        out = layer.forward_native(x, logits)
        assert len(recorder.calls) == 1 and recorder.calls[0][1] == 2  # (name, top_k, logits)
        assert torch.equal(recorder.calls[0][2], logits)
        alive = weakref.ref(layer)
        del layer
        assert alive() is None, "the recorder's wrapper keeps the module alive through a reference cycle"
    finally:
        gc.enable()
    assert out.shape == x.shape


def test_cast_copy_casts_without_touching_the_original():
    from fk_pytest.build import cast_copy

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4)).double()
    model[0].register_buffer("steps", torch.arange(3))  # integer buffers keep their dtype
    low = cast_copy(model, torch.bfloat16)
    for (name, a), (_, b) in zip(model.state_dict().items(), low.state_dict().items()):
        assert a.dtype == (torch.float64 if a.is_floating_point() else torch.int64), name
        expected = a.to(torch.bfloat16) if a.is_floating_point() else a
        assert b.dtype == expected.dtype and torch.equal(b, expected), name
    assert isinstance(low[0].weight, torch.nn.Parameter)
    assert low[0].weight.data_ptr() != model[0].weight.data_ptr()
