"""The end-to-end level at tensor-parallel degree 2 on the CPU (fk_pytest.e2e_tp): the Mixtral cut's
chat case served by the engine on two gloo ranks, judged on the degree-1 calibration. A copy of the
reference keeps full credit (the example tree too, in the README's main job); a tree whose expert
block never all-reduces its partial outputs loses it (at degree 1 that tree is right: only the
ranks can catch it)."""
import pytest

from conftest import CANDIDATES, ROOT
from fk_pytest import status
from fk_pytest.candidates import CandidateSource
from fk_pytest.compose import candidate_lookup
from fk_pytest.e2e_run import CalibrationCache, run_e2e


@pytest.fixture(scope="module")
def mixtral():
    from tasks.e2e import E2E as SPEC

    cases = {c.params.get("tp", 1): c for c in SPEC.cases("cpu") if c["model"] == "mixtral-8x7b"}
    assert cases[2].id == "mixtral-8x7b-chat-tp2"  # the main job's case
    cache = CalibrationCache()

    def score(tree, tp=2):
        lookup = candidate_lookup(CandidateSource(tree)) if tree else None
        return run_e2e(SPEC, cases[tp], "cpu", lookup, tree is not None, cache=cache)
    return score


def test_a_copy_of_the_reference_keeps_full_credit_at_tp_2(mixtral):
    # (the example tree is scored on this case by the README's main job)
    r = mixtral(ROOT / "kernels_reference")
    assert r.case_id.endswith("-tp2") and r.status == status.PASSED and r.credit == 1.0, r.message
    assert r.mutants and all(m.caught for m in r.mutants.values())  # the degree-1 calibration's


def test_an_expert_block_without_its_all_reduce_fails_only_at_tp_2(mixtral):
    tree = CANDIDATES / "tp_moe_no_all_reduce"
    assert mixtral(tree, tp=1).status == status.PASSED
    r = mixtral(tree)
    assert r.status == status.WRONG_RESULT and r.credit < 0.9 and "FusedMoE" in r.swapped, r.message


def test_a_spec_without_an_architecture_builder_is_refused_with_its_name():
    from fk_pytest.e2e import E2ESpec

    with pytest.raises(NotImplementedError, match="has no build_architecture"):
        E2ESpec().build_architecture(None, "cpu")


def test_a_tp_case_on_a_gpu_device_is_not_run_and_says_why():
    """Its ranks run on the CPU only: on CUDA the case is reported NOT_RUN with the reason, before
    anything is built (no GPU needed to check it)."""
    from tasks.e2e import E2E as SPEC

    case = next(c for c in SPEC.cases("cpu") if c.params.get("tp") == 2)
    r = run_e2e(SPEC, case, "cuda", None, False)
    assert r.status == status.NOT_RUN and "2 ranks" in r.message and "gloo only" in r.message, r.message
