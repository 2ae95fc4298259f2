"""Composed mode: an L1 candidate runs inside every higher-level task that uses its module."""
import json
import shutil

import pytest
import torch

from conftest import CANDIDATES

# Degree 1 only: composed mode on tensor-parallel ranks is tests/test_tensor_parallel.py's.
SELECT = ["-k", "qwen3-0.6b and (decode-T1-bf16 or decode-B3) and correctness and (llama_mlp or decoder or causal) "
                "and not tp2"]
HIGHER = ("llama_mlp", "llama_decoder_layer", "llama_for_causal_lm")


def _tree(tmp_path):
    """Honest L2..L4 candidates (tests/candidates/composed) beside the wrong L1 SiluAndMul."""
    tree = tmp_path / "tree"
    if not tree.exists():
        shutil.copytree(CANDIDATES / "composed", tree)
        (tree / "L1").mkdir()
        shutil.copy(CANDIDATES / "silu_swapped/L1/silu_and_mul.py", tree / "L1/silu_and_mul.py")
    return tree


def _run(suite_run, tmp_path, mode):
    report = tmp_path / f"{mode}.json"
    result = suite_run(*SELECT, f"--fk-candidate={_tree(tmp_path)}", f"--fk-mode={mode}",
                       f"--fk-report={report}")
    return result, {t["name"]: t for t in json.loads(report.read_text())["tasks"]}


def test_wrong_l1_candidate_fails_the_l2_task_only_when_composed(suite_run, tmp_path):
    result, tasks = _run(suite_run, tmp_path, "independent")
    assert result.ret == 0
    assert {t: tasks[t]["status"] for t in HIGHER} == dict.fromkeys(HIGHER, "PASSED")
    assert tasks["llama_mlp"]["swapped_modules"] == ["LlamaMLP"]
    assert tasks["llama_for_causal_lm"]["swapped_modules"] == ["LlamaForCausalLM"]

    result, tasks = _run(suite_run, tmp_path, "composed")
    assert result.ret == 1
    assert {t: tasks[t]["status"] for t in HIGHER} == dict.fromkeys(HIGHER, "WRONG_RESULT")
    assert tasks["llama_mlp"]["swapped_modules"] == ["LlamaMLP", "SiluAndMul"]
    assert set(tasks["llama_decoder_layer"]["swapped_modules"]) == {"LlamaDecoderLayer", "LlamaMLP", "SiluAndMul"}
    assert set(tasks["llama_for_causal_lm"]["swapped_modules"]) == {
        "LlamaForCausalLM", "LlamaDecoderLayer", "LlamaMLP", "SiluAndMul"}


def test_composed_mode_scores_l1_candidates_inside_a_reference_container(suite_run, tmp_path):
    """Without an L2 candidate, composed mode still runs the L2 task: reference container,
    candidate children (the report says which)."""
    tree = tmp_path / "l1only" / "L1"
    tree.mkdir(parents=True)
    (tree / "silu_and_mul.py").write_text((CANDIDATES / "silu_swapped/L1/silu_and_mul.py").read_text())
    report = tmp_path / "r.json"
    suite_run(*SELECT, f"--fk-candidate={tree.parent}", "--fk-mode=composed", f"--fk-report={report}")
    tasks = {t["name"]: t for t in json.loads(report.read_text())["tasks"]}
    assert tasks["llama_mlp"]["status"] == "WRONG_RESULT"
    assert tasks["llama_mlp"]["swapped_modules"] == ["SiluAndMul"]
    assert tasks["llama_mlp"]["delegated"] == []  # a reference container is not delegation here


def test_composed_task_untouched_by_the_tree_is_not_attempted(suite_run, tmp_path):
    """A tree whose only module (RMSNorm) does not occur in LlamaMLP must not earn MLP coverage."""
    tree = tmp_path / "rmsonly" / "L1"
    tree.mkdir(parents=True)
    (tree / "rms_norm.py").write_text((CANDIDATES.parent.parent / "examples/candidates/triton/L1/rms_norm.py").read_text())
    report = tmp_path / "r.json"
    suite_run("-k", "llama_mlp and qwen3-0.6b-decode-T1-bf16", f"--fk-candidate={tree.parent}",
              "--fk-mode=composed", f"--fk-report={report}")
    tasks = {t["name"]: t for t in json.loads(report.read_text())["tasks"]}
    assert tasks["llama_mlp"]["status"] == "NOT_ATTEMPTED" and not tasks["llama_mlp"]["valid"]


def _norm_that_cannot_load(error: Exception):
    from kernels_reference.L1.rms_norm import RMSNorm

    class NormThatCannotLoad(RMSNorm):
        def load_state_dict(self, *args, **kwargs):
            raise error
    return NormThatCannotLoad


@pytest.mark.parametrize("error, verdict", [
    (RuntimeError("Missing key(s) in state_dict: 'weight'"), "STATE_DICT_MISMATCH"),
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 384.00 MiB"), None)])
def test_a_full_device_is_not_blamed_on_the_class_as_a_state_dict_mismatch(error, verdict):
    """Loading the reference's weights into a candidate class fails either because the class lays
    them out wrongly (STATE_DICT_MISMATCH, the class's fault) or because the device is full (a
    24-layer Qwen3-30B-A3B cut held twice on an 80 GB H100, 2026-12-07): the second is not a
    verdict on the class, so it propagates as itself, standalone and composed."""
    from fk_pytest.build import instantiate, instantiate_candidate, master_state
    from fk_pytest.compose import swap_children
    from fk_pytest.errors import CandidateError
    from fk_pytest.registry import all_tasks
    from kernels_reference.L1.rms_norm import RMSNorm

    task = all_tasks()["rms_norm"]
    case = task.cases("cpu")[0]
    state = master_state(task, case, seed=0)
    cls = _norm_that_cannot_load(error)
    holder = torch.nn.Module()
    holder.norm = instantiate(task.reference, task, case, state, "cpu", case.dtype)
    if verdict is None:
        with pytest.raises(torch.OutOfMemoryError):
            instantiate_candidate(cls, task, case, state, "cpu", case.dtype)
        with pytest.raises(torch.OutOfMemoryError):
            swap_children(holder, lambda ref: cls if ref is RMSNorm else None)
        return
    with pytest.raises(CandidateError) as caught:
        instantiate_candidate(cls, task, case, state, "cpu", case.dtype)
    assert caught.value.status == verdict and "Missing key" in caught.value.message
    composition = swap_children(holder, lambda ref: cls if ref is RMSNorm else None)
    assert composition.failed["RMSNorm"].startswith(verdict)
