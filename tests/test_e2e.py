"""End-to-end scoring: the credit rule, honest and wrong composed candidates, both MacroEvals."""
import json

import pytest

from conftest import CANDIDATES, ROOT
from fk_pytest.e2e import FAIL_AT, E2EResult, blend, credit, discrepancies, percentile, sampling_allowance
from fk_pytest.macro import e2e_macro_eval
from fk_pytest.report import format_table

E2E = ["-m", "level4", "-k", "llama and e2e"]


# ---- the rules ------------------------------------------------------------------------------------
def test_credit_is_full_at_the_noise_floor_and_none_at_half():
    assert credit(0.0, 0.0) == 1.0
    assert credit(0.05, 0.05) == 1.0 and credit(0.03, 0.05) == 1.0
    assert credit(FAIL_AT, 0.1) == 0.0 and credit(0.9, 0.1) == 0.0
    assert credit(0.3, 0.1) == pytest.approx(0.5)  # halfway between g and f
    assert credit(0.1, 0.0) == pytest.approx(0.8)
    assert credit(0.2, 0.1) > credit(0.25, 0.1) > credit(0.3, 0.1)


def test_credit_with_a_noise_floor_at_or_above_half_is_a_step():
    assert credit(0.55, 0.6) == 1.0 and credit(0.61, 0.6) == 0.0
    assert credit(0.5, 0.5) == 1.0 and credit(0.51, 0.5) == 0.0
    with pytest.raises(ValueError):
        credit(float("nan"), 0.1)


def test_sampling_allowance_shrinks_with_the_compared_tokens():
    # one request of 13 tokens, floor 0: one flipped token (d = 1/13) is within the allowance
    assert sampling_allowance(0.0, 13) == pytest.approx(2 * ((1 / 13) * (12 / 13) / 13) ** 0.5)
    assert 1 / 13 < sampling_allowance(0.0, 13) < 0.2
    # thousands of tokens: the allowance vanishes, so a candidate 6 points above the floor is not valid
    assert sampling_allowance(0.04, 5000) < 0.006
    assert credit(0.10, 0.04 + sampling_allowance(0.04, 5000)) < 0.9
    assert sampling_allowance(0.1, 0) == 0.0


def test_percentile_discrepancy_and_blend():
    assert percentile([0.0, 1.0], 95) == pytest.approx(0.95)
    assert percentile([0.2], 95) == 0.2
    assert percentile([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1.0], 95) == pytest.approx(0.05)
    # sequences = prompt + generated; predictions cover the generated tokens only
    assert discrepancies([[5, 6, 7, 9]], [[1, 2, 5, 6, 7, 8]], [2]) == [0.25]
    with pytest.raises(ValueError):
        discrepancies([[5]], [[1, 5, 6]], [1])
    assert blend(4.0, 1.0) == pytest.approx(2.0)


def _result(model, scenario, status, credit_, speedup=None):
    r = E2EResult(f"{model}-{scenario}", "llm_e2e", "llm", model, scenario, status=status, credit=credit_)
    if speedup is not None:
        r.speedup_blended, r.informational = speedup, False
    return r


def test_e2e_macro_members_are_models():
    results = [_result("a", "chat", "PASSED", 1.0, 2.0), _result("a", "batch-1", "PASSED", 0.95, 8.0),
               _result("b", "chat", "WRONG_RESULT", 0.2, 3.0), _result("c", "chat", "NOT_RUN", 0.0)]
    m = e2e_macro_eval(results)
    fam = m["families"]["llm"]
    assert [x["model"] for x in fam["models"]] == ["a", "b"]  # NOT_RUN left out
    assert fam["Cov_f"] == 0.5 and fam["C_f"] == pytest.approx((0.975 + 0.2) / 2)
    assert fam["S_f"] == pytest.approx(4.0)  # geomean of a's scenarios; b is not valid
    assert m["MacroEval"] == pytest.approx(4.0 * fam["C_f"] * 0.5) and m["speed_measured"]
    cpu = e2e_macro_eval([_result("a", "chat", "PASSED", 1.0)])
    assert cpu["S"] is None and cpu["MacroEval"] == 1.0 and "S taken as 1" in cpu["note"]


# ---- through the plugin -------------------------------------------------------------------------
def _e2e(suite_run, tmp_path, candidate, *extra, select=E2E):
    report = tmp_path / "r.json"
    result = suite_run(*select, f"--fk-candidate={candidate}", f"--fk-report={report}", *extra)
    data = json.loads(report.read_text())
    return result, data, {c["case_id"]: c for c in data["e2e"]["cases"]}


def test_honest_composed_candidate_gets_full_credit(suite_run, tmp_path):
    result, data, cases = _e2e(suite_run, tmp_path, CANDIDATES / "composed")
    assert result.ret == 0
    case = cases["llama-3.1-8b-chat"]
    assert case["status"] == "PASSED" and case["valid"] and case["credit"] == 1.0
    assert {"LlamaForCausalLM", "LlamaDecoderLayer", "LlamaMLP"} <= set(case["swapped"])
    assert set(case["noise"]) >= {"teacher-forced", "rebatched"} and case["g"] is not None
    assert case["speedup_throughput"] > 0 and case["informational"] and case["speedup"] is None
    assert data["schema_version"] == "1.1" and data["e2e"]["macro"]["MacroEval"] == 1.0
    result.stdout.fnmatch_lines(["*llama-3.1-8b-chat*PASSED*", "kernel-level MacroEval - | end-to-end MacroEval 1.000"])


def test_wrong_composed_candidate_gets_low_credit_and_is_not_valid(suite_run, tmp_path):
    """The fused-add RMSNorm that returns the old residual passes its own L1 inputs' shapes but
    breaks every layer of the model."""
    result, data, cases = _e2e(suite_run, tmp_path, CANDIDATES / "rms_old_residual")
    assert result.ret == 1
    case = cases["llama-3.1-8b-chat"]
    assert case["status"] == "WRONG_RESULT" and not case["valid"]
    assert case["credit"] < 0.5 and case["d"] > case["g"]
    assert "RMSNorm" in case["swapped"]
    assert data["e2e"]["macro"]["Cov"] == 0.0
    result.stdout.fnmatch_lines(["*llama-3.1-8b-chat*WRONG_RESULT*"])


def test_kernel_and_e2e_macroevals_side_by_side(suite_run, tmp_path):
    html = tmp_path / "r.html"
    select = ["-k", "(llama and e2e) or (rms and llama-3.1-8b-decode-T1-bf16 and correctness)"]
    result, data, _ = _e2e(suite_run, tmp_path, ROOT / "examples/candidates/triton", f"--fk-html={html}",
                           select=select)
    assert result.ret == 0
    assert [t["name"] for t in data["tasks"]] == ["rms_norm"]  # e2e cases are no kernel task
    k, e = data["macro"]["MacroEval"], data["e2e"]["macro"]["MacroEval"]
    result.stdout.fnmatch_lines([f"kernel-level MacroEval {k:.3f} | end-to-end MacroEval {e:.3f}"])
    assert "end-to-end MacroEval" in html.read_text() and "llama-3.1-8b-chat" in html.read_text()
    assert format_table(data).endswith(f"kernel-level MacroEval {k:.3f} | end-to-end MacroEval {e:.3f}")


def test_untouched_model_is_not_attempted(suite_run, tmp_path):
    """A tree whose only module is not part of the model earns no end-to-end coverage."""
    tree = tmp_path / "tree" / "L1"
    tree.mkdir(parents=True)
    (tree / "linear.py").write_text("from kernels_reference.L1.linear import *  # noqa\n"
                                    "class NotInTheModel:\n    pass\n")
    result, data, cases = _e2e(suite_run, tmp_path, tree.parent)
    assert cases["llama-3.1-8b-chat"]["status"] == "NOT_ATTEMPTED"
    assert data["e2e"]["macro"]["Cov"] == 0.0
