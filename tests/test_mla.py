"""Verdicts of the MLA tasks (multi-head latent attention, DeepSeek's YaRN rope, the DeepSeek-V2
attention block, DeepSeek-V2's decoder layer and 2-layer model): the honest example candidates pass
every CPU case; wrong ones fail with WRONG_RESULT through the real verdict machinery
(``evaluate_case``, one input draw per case)."""
import pytest

from fk_pytest import status

from conftest import CANDIDATES, EXAMPLES, ROOT
from test_verdicts import assert_passes_every_case, load, verdicts

MLA_TASKS = ["mla_attention", "deepseek_rotary_emb", "deepseek_v2_attention", "deepseek_v2_decoder_layer",
             "deepseek_v2_for_causal_lm"]


@pytest.mark.parametrize("task_name", MLA_TASKS)
def test_honest_candidates_pass_every_case(task_name):
    assert_passes_every_case(task_name, EXAMPLES)


def test_the_reference_tree_as_a_candidate_passes_the_rope_task():
    """(Not the attention tasks: a copied tree imports its own ``forward_context`` module, whose
    context stack the task never sets; the existing ``attention`` task has the same limitation.)"""
    assert_passes_every_case("deepseek_rotary_emb", ROOT / "kernels_reference")


@pytest.mark.parametrize("tree, task_name, where, output", [
    ("mla_no_rope_scores", "mla_attention", "decode", "out"),
    ("mla_no_store", "mla_attention", "decode", "kv_cache_0"),  # the output is right: the cache is not
    ("mla_rope_neox", "deepseek_rotary_emb", "decode", "query"),
    ("mla_no_mscale", "deepseek_v2_attention", "decode", "out"),
    ("deepseek_no_fused_add", "deepseek_v2_decoder_layer", "decode", "hidden_states"),
    ("deepseek_final_norm_no_residual", "deepseek_v2_for_causal_lm", "decode", "hidden_states"),
])
def test_wrong_candidates_fail(tree, task_name, where, output):
    counts, results = verdicts(task_name, load(CANDIDATES / tree, task_name))
    failing = [r for r in results if not r.passed]
    assert failing, f"{tree} passed every case"
    assert {r.status for r in failing} == {status.WRONG_RESULT}
    assert any(where in r.case_id for r in failing), [r.case_id for r in failing]
    assert all(f"output {output!r}" in r.message for r in failing), [r.message for r in failing][:2]


def test_no_store_is_right_except_for_the_cache():
    """The no-store candidate's attention output is within the bar: only the cache output fails it."""
    _, results = verdicts("mla_attention", load(CANDIDATES / "mla_no_store", "mla_attention"))
    for r in results:
        by_name = {e.name: e for e in r.errors}
        assert by_name["out"].passed(2.0) and not by_name["kv_cache_0"].passed(2.0), r.case_id
