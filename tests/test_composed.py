"""Composed mode: an L1 candidate runs inside every higher-level task that uses its module."""
import json
import shutil

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
