"""End-to-end cases of the state models (Mamba-2, Qwen3-Next) on their CPU cuts: sensitive (every
applicable built-in mutant caught, the decode-path ones right on a packed prompt), the
reference-equivalent tree and the example Triton tree (interpreted) with full credit. One test per
model, so that under ``-n 2`` each model is calibrated once, on one worker, for all its trees."""
import pytest

from conftest import ROOT
from fk_pytest import status
from fk_pytest.candidates import CandidateSource
from fk_pytest.compose import candidate_lookup
from fk_pytest.e2e import DECODE, DECODE_PATH, PREFILL
from fk_pytest.e2e_run import CalibrationCache, run_e2e

ARCHITECTURE = {"mamba2-2.7b": "Mamba2ForCausalLM", "qwen3-next-80b-a3b": "Qwen3NextForCausalLM"}


@pytest.mark.parametrize("model", sorted(ARCHITECTURE))
def test_state_model_case_is_sensitive_and_right_trees_get_full_credit(model, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # as the plugin sets it on the CPU
    from tasks.e2e import E2E as SPEC, STATE_MUTANT_NAMES
    case = next(c for c in SPEC.cases("cpu") if c["model"] == model)
    cache = CalibrationCache()

    def score(lookup):
        return run_e2e(SPEC, case, "cpu", lookup, True, cache=cache)

    # The reference tree as a candidate: exact on both paths; every applicable mutant caught.
    ref = score(candidate_lookup(CandidateSource(ROOT / "kernels_reference")))
    assert ref.status == status.PASSED and ref.credit == 1.0, ref.message
    assert ref.paths[PREFILL]["d"] == 0.0 and ref.paths[DECODE]["d"] == 0.0
    assert ARCHITECTURE[model] in ref.swapped and ref.output_tokens >= 64
    assert set(ref.mutants) == set(STATE_MUTANT_NAMES[model])
    assert all(m.d is not None and m.caught and m.margin >= 0 for m in ref.mutants.values()), ref.mutants
    assert ref.paths[DECODE]["steps"].get("decode-padded", 0) >= 10  # the padded decode path ran

    # Each decode-path mutant composed as a candidate: right on packed prompts, wrong on decode steps.
    for name, mutant in SPEC.mutants(case).items():
        if mutant.kind != DECODE_PATH or "carried-state" not in name:
            continue
        r = score(lambda cls, classes=mutant.classes: classes.get(cls))
        assert r.status == status.WRONG_RESULT and r.path == DECODE, (name, r.message)
        assert r.paths[PREFILL]["d"] == 0.0 and r.paths[PREFILL]["credit"] == 1.0, (name, r.paths)

    # The example Triton tree, interpreted.
    tri = score(candidate_lookup(CandidateSource(ROOT / "examples/candidates/triton")))
    assert tri.status == status.PASSED and tri.credit == 1.0, tri.message
    assert tri.interpreted


def test_the_state_models_read_64k_token_prompts_on_the_full_profile():
    """The long-prefill scenario (two 65536-token prompts) is served to both state models on the full
    profile, and only to them; chunked prefill then carries each sequence's state over eight chunks."""
    from kernels_reference.engine.scenarios import SCENARIOS
    from tasks.e2e import E2E as SPEC, STATE_MODELS

    long = [c for c in SPEC.cases("full", scale=1.0) if c["scenario"] == "long-prefill"]
    assert sorted(c["model"] for c in long) == sorted(STATE_MODELS)
    assert SCENARIOS["long-prefill"].engine_args["max_num_batched_tokens"] * 8 == 65536
    for case in long:
        assert [len(p) for p, _ in SPEC.requests(case)] == [65536, 65536]
        assert SPEC.engine_args(case)["chunked_prefill"]
