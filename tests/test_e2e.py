"""End-to-end scoring: the credit rule, the built-in mutants, honest, wrong and failing composed
candidates inside the trained SmolLM2-135M, and both MacroEvals side by side."""
import json

import pytest

from conftest import CANDIDATES, ROOT, run_suite_in_process, suite_args
from fk_pytest import status
from fk_pytest.candidates import CandidateSource
from fk_pytest.compose import candidate_lookup
from fk_pytest.e2e import (DECODE, FAIL_AT, GRADED, GROSS, PATHS, PREFILL, E2EResult, Mutant, blend, catch_at,
                           credit, noise_floor, noise_tallies, sampling_allowance, stable_positions, tally)
from fk_pytest.e2e_run import CalibrationCache, ScenarioRun, _judge, run_e2e
from fk_pytest.macro import e2e_macro_eval
from fk_pytest.report import format_table

E2E = ["-m", "level4", "-k", "e2e"]


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


def test_a_flip_is_counted_only_where_no_noise_run_flips_and_pooled_over_tokens():
    expected = [[1, 2, 3, 4], [5, 6]]
    noise = {"a/prefill-forced": [[1, 2, 3, 4], [5, 6]], "b/prefill-forced": [[1, 9, 3, 4], [5, 6]]}
    stable = stable_positions(noise, expected)
    assert stable == [[True, False, True, True], [True, True]]  # b flips position 1: a near-tie
    t = tally([[1, 7, 3, 8], [0, 6]], expected, stable)  # flips at 1 (near-tie), 3 and (1, 0)
    assert (t.flipped, t.compared) == (2, 5) and t.d == pytest.approx(0.4)  # tokens, not requests
    assert t.per_request == [pytest.approx(1 / 3), 0.5] and t.compared_per_request == [3, 2]
    with pytest.raises(ValueError, match="predictions for"):
        tally([[1, 2]], [[1, 2, 3]], [[True] * 3])


def test_each_noise_run_is_scored_on_the_positions_the_others_keep():
    expected = [[1, 2, 3, 4]]
    noise = {"a/decode-forced": [[9, 2, 3, 4]], "b/decode-forced": [[9, 2, 3, 8]]}
    t = noise_tallies({"chat": (expected, noise)})
    # a is scored where b agrees (positions 1, 2): no flip there; b where a agrees (1, 2, 3): one flip
    assert (t["chat/a/decode-forced"].flipped, t["chat/a/decode-forced"].compared) == (0, 2)
    assert (t["chat/b/decode-forced"].flipped, t["chat/b/decode-forced"].compared) == (1, 3)
    g, run = noise_floor(t, DECODE)
    assert g == pytest.approx(1 / 3) and run == "b/decode-forced"


def test_the_floor_pools_a_kind_of_noise_run_over_the_models_scenarios():
    # one flip in a 4-token scenario and none in a 60-token one: 1/64, not 1/4
    short = ([[1, 2, 3, 4]], {"r/prefill-forced": [[1, 2, 3, 9]], "s/prefill-forced": [[1, 2, 3, 4]]})
    long_ = ([[7] * 60], {"r/prefill-forced": [[7] * 60], "s/prefill-forced": [[7] * 60]})
    g, run = noise_floor(noise_tallies({"batch-1": short, "chat": long_}), PREFILL)
    assert g == pytest.approx(1 / 64) and run == "r/prefill-forced"
    with pytest.raises(ValueError):
        noise_floor({})
    assert blend(4.0, 1.0) == pytest.approx(2.0)


def test_mutant_kinds_and_where_each_is_caught():
    assert catch_at(GROSS, 0.05) == FAIL_AT
    assert catch_at(GRADED, 0.05) == pytest.approx(0.05 + 0.1 * 0.45)  # credit 0.9 there
    assert credit(catch_at(GRADED, 0.05) + 1e-9, 0.05) < 0.9
    with pytest.raises(ValueError, match="kind"):
        Mutant({}, "subtle")


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


# ---- sensitivity: the mutants decide whether a case counts --------------------------------------
TOKENS = 100  # a synthetic case: 4 requests of 25 target tokens, every noise run exact


def _top1(d: float) -> list:
    """Predictions of the synthetic case with a share ``d`` of its tokens flipped."""
    flips = round(d * TOKENS)
    return [[1 if r * 25 + i < flips else 0 for i in range(25)] for r in range(4)]


def _judged(d_candidate, mutant_ds, d_decode=None, kinds=None):
    """Judge a synthetic case: ``mutant_ds`` name -> d on both paths, or {path: d}."""
    result = E2EResult("m-chat", "llm_e2e", "llm", "m", "chat", output_tokens=TOKENS)
    expected = _top1(0.0)
    candidate = {PREFILL: _top1(d_candidate), DECODE: _top1(d_candidate if d_decode is None else d_decode)}
    mutants = {n: ((kinds or {}).get(n, GROSS),
                   None if d is None else {p: _top1(v) for p, v in (d if isinstance(d, dict) else
                                                                      {DECODE: d, PREFILL: d}).items()},
                   ["X"]) for n, d in mutant_ds.items()}
    noise = {f"teacher-forced/{p}": expected for p in PATHS}
    run = ScenarioRun("m-chat", [], [], [], noise, mutants, expected)
    _judge(result, {"m-chat": run}, "m-chat", candidate)
    return result


def test_a_case_whose_mutants_all_lose_every_credit_judges_the_candidate():
    ok = _judged(0.0, {"rope": 0.8, "rms": 1.0})
    assert ok.status == status.PASSED and ok.credit == 1.0
    assert all(m.caught for m in ok.mutants.values()) and ok.min_mutant_margin == pytest.approx(0.3)
    bad = _judged(0.6, {"rope": 0.8, "rms": 1.0})
    assert bad.status == status.WRONG_RESULT and bad.credit == 0.0


def test_a_case_in_which_a_mutant_still_earns_credit_is_insensitive_and_does_not_count():
    r = _judged(0.0, {"rope": 0.2, "rms": 1.0})  # random-weight models: RoPE barely moves top-1
    assert r.status == status.INSENSITIVE and not r.valid and not r.counts
    assert "rope" in r.message and r.mutants["rope"].credit > 0 and r.mutants["rope"].margin < 0
    m = e2e_macro_eval([r, _result("m2", "chat", "PASSED", 1.0)])
    assert [x["model"] for x in m["families"]["llm"]["models"]] == ["m2"] and "INSENSITIVE" in m["note"]


def test_an_insensitive_case_with_a_reason_on_record_says_it_and_the_others_do_not():
    from types import SimpleNamespace

    from fk_pytest.e2e import note_blindness

    spec = SimpleNamespace(blind_reason=lambda case: "its RoPE turns too slowly here" if case == "blind" else None)
    r = _judged(0.0, {"rope": 0.02, "rms": 1.0})
    note_blindness(spec, "blind", r)
    assert r.status == status.INSENSITIVE and "on record: its RoPE turns too slowly here" in r.message
    # a case with nothing on record, and a sensitive case with a reason on record, gain nothing
    for case, judged in (("other", _judged(0.0, {"rope": 0.02, "rms": 1.0})),
                         ("blind", _judged(0.0, {"rope": 0.8, "rms": 1.0}))):
        before = judged.message
        note_blindness(spec, case, judged)
        assert judged.message == before


def test_credit_needs_both_paths_and_names_the_one_that_decided():
    r = _judged(0.0, {"rope": 0.8}, d_decode=0.3)  # right through prefill, wrong on decode steps
    assert r.status == status.WRONG_RESULT and r.path == DECODE and r.credit < 0.9
    assert r.paths[PREFILL]["credit"] == 1.0 and r.paths[DECODE]["d"] == pytest.approx(0.3)
    assert "decode-forced d=0.300" in r.message and "on decode-forced" in r.message
    assert _judged(0.3, {"rope": 0.8}, d_decode=0.0).path == PREFILL


def test_graded_and_decode_path_mutants_must_fail_the_case_not_lose_every_credit():
    kinds = {"eps": GRADED, "slot": "decode-path"}
    r = _judged(0.0, {"rope": 0.8, "eps": 0.12, "slot": {DECODE: 0.2, PREFILL: 0.0}}, kinds=kinds)
    assert r.status == status.PASSED, r.message
    assert r.mutants["eps"].caught and 0 < r.mutants["eps"].credit < 0.9 and r.mutants["eps"].margin > 0
    assert r.mutants["slot"].caught and r.mutants["slot"].d == 0.2 and r.mutants["slot"].paths[PREFILL] == 0.0
    blind = _judged(0.0, {"rope": 0.8, "eps": 0.04}, kinds=kinds)  # within the floor: not seen
    assert blind.status == status.INSENSITIVE and "eps (graded" in blind.message
    assert not blind.mutants["eps"].caught and blind.mutants["eps"].margin < 0


def test_a_mutant_the_model_does_not_contain_is_reported_not_counted():
    r = _judged(0.0, {"rope": 0.8, "absent": None})
    assert r.status == status.PASSED and r.mutants["absent"].d is None and "no module" in r.mutants["absent"].note


# ---- inside the trained model, in process (one calibration shared by every tree) ----------------
def _smollm2_scorer():
    from tasks.e2e import E2E as SPEC
    case = SPEC.cases("cpu")[0]
    why = SPEC.unavailable(case)
    if why:
        pytest.skip(why)
    cache = CalibrationCache()

    def score(tree):
        lookup = candidate_lookup(CandidateSource(tree)) if tree else None
        return run_e2e(SPEC, case, "cpu", lookup, tree is not None, cache=cache)
    score.cache = cache
    return score


# One calibration (noise runs and every built-in mutant: about 170 s on a 2-core machine) serves
# every ``test_smollm2_*`` test of this module: under ``-n`` they run on one worker
# (tests/conftest.py, SHARED_FIXTURE_GROUPS), so a second worker does not calibrate the model again.
@pytest.fixture(scope="module")
def smollm2():
    return _smollm2_scorer()


def test_smollm2_case_is_sensitive_and_an_honest_minimal_tree_gets_full_credit(smollm2):
    r = smollm2(CANDIDATES / "minimal_signatures")  # PyTorch, inherited __init__, *args/**kwargs
    assert r.status == status.PASSED and r.credit == 1.0, r.message
    assert r.output_tokens >= 64 and r.pooled_over == ["smollm2-135m-chat"]
    assert {"RMSNorm", "RotaryEmbedding", "SiluAndMul"} <= set(r.swapped)
    ran = {name: m for name, m in r.mutants.items() if m.d is not None}
    assert {m.kind for m in ran.values()} == {"gross", "graded", "decode-path"}
    assert all(m.caught and m.margin >= 0 for m in ran.values()), r.mutants
    # The floor is tight: a graded mutant with d <= 0.15 fails the case.
    assert any(m.kind == "graded" and m.d <= 0.15 for m in ran.values()), r.mutants
    # Decode-path mutants are seen on decode steps only: prefill-forced they stay within the floor.
    for m in ran.values():
        if m.kind == "decode-path" and "prefill-forced" in m.paths:
            assert m.paths["prefill-forced"] <= r.paths["prefill-forced"]["g"] + r.paths["prefill-forced"]["allowance"]
    assert r.paths["decode-forced"]["steps"].get("decode-padded", 0) >= 10  # the padded decode path ran
    assert "no module" in r.mutants["topk-expert-off-by-one"].note  # a dense model has no router
    # The kept reference holds no engine's KV cache (on the H200 one more cache beside the
    # candidate's engine ran Mixtral out of memory).
    reference = smollm2.cache.current.reference
    assert all(getattr(m, "kv_cache", None) is None for m in reference.modules())


@pytest.mark.parametrize("tree", ["rope_no_positions", "rms_old_residual", "silu_swapped"])
def test_smollm2_catches_each_wrong_kernel_with_zero_credit(smollm2, tree):
    r = smollm2(CANDIDATES / tree)
    assert r.status == status.WRONG_RESULT and r.credit == 0.0 and r.d >= FAIL_AT, (r.d, r.message)


def test_smollm2_the_reference_tree_itself_as_candidate_agrees_on_both_paths(smollm2):
    """A tree that copies the reference (relative imports of its forward context and configs
    included) reads the engine's metadata, not a private empty copy: before 2026-12-02 it was
    WRONG_RESULT here (d 0.28)."""
    r = smollm2(ROOT / "kernels_reference")
    assert r.status == status.PASSED and r.credit == 1.0, r.message
    assert r.paths["prefill-forced"]["d"] == 0.0 and r.paths["decode-forced"]["d"] == 0.0
    assert "LlamaForCausalLM" in r.swapped


def test_smollm2_sees_a_decode_only_bug_that_prefill_scoring_passes(smollm2):
    r = smollm2(CANDIDATES / "attn_decode_stale_slot")  # plain PyTorch, wrong on decode steps only
    assert r.status == status.WRONG_RESULT and r.path == "decode-forced", r.message
    assert r.paths["prefill-forced"]["credit"] == 1.0 and r.credit < 0.9


def test_smollm2_a_crash_in_decode_only_names_the_path_step_and_batch(smollm2):
    r = smollm2(CANDIDATES / "attn_decode_crash")
    assert r.status == status.RUNTIME_ERROR
    assert "(decode-forced): IndexError" in r.message and "in engine step" in r.message
    assert "decode, 4 sequences" in r.message or "decode context lengths" in r.message, r.message


def test_smollm2_names_the_class_that_failed_to_compose(smollm2, tmp_path):
    tree = tmp_path / "tree" / "L1"
    tree.mkdir(parents=True)
    (tree / "rms_norm.py").write_text((CANDIDATES / "minimal_signatures/L1/rms_norm.py").read_text())
    (tree / "silu_and_mul.py").write_text("raise ImportError('no such kernel yet')\n")
    r = smollm2(tree.parent)
    assert r.status == status.IMPORT_ERROR and "SiluAndMul (L1/silu_and_mul.py)" in r.message
    assert r.swapped == ["RMSNorm"] and set(r.failed_classes) == {"SiluAndMul"}


def test_smollm2_untouched_model_is_not_attempted(smollm2, tmp_path):
    tree = tmp_path / "tree" / "L1"
    tree.mkdir(parents=True)
    (tree / "linear.py").write_text("class NotInTheModel:\n    pass\n")
    assert smollm2(tree.parent).status == status.NOT_ATTEMPTED


def test_a_case_too_short_to_decide_is_a_task_error():
    from tasks.e2e import E2E as SPEC

    class Short(type(SPEC)):
        def requests(self, case):
            return [([1, 2, 3], 13)]
    r = run_e2e(Short(), SPEC.cases("cpu")[0], "cpu", None, False)
    assert r.status == status.TASK_ERROR and "13 compared tokens" in r.message


# ---- through the plugin -------------------------------------------------------------------------
# The Mixtral CPU cut (seconds) rather than SmolLM2 (a minute of calibration): the same path.
MIXTRAL_RUN = ["-k", "(e2e and mixtral and not tp2) or (rms and llama-3.1-8b-decode-T1-bf16 and correctness)",
               f"--fk-candidate={CANDIDATES / 'minimal_signatures'}"]


# One run through the plugin, with a cache folder, serves both tests below (one Mixtral-cut
# calibration instead of two; under ``-n`` they run on one worker: tests/conftest.py,
# SHARED_FIXTURE_GROUPS): the side-by-side scores, and the calibration entry its worker wrote.
@pytest.fixture(scope="module")
def mixtral_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("mixtral_run")
    paths = {"html": out / "r.html", "report": out / "r.json", "cache": out / "cache"}
    result = run_suite_in_process(suite_args([*MIXTRAL_RUN, f"--fk-report={paths['report']}",
                                              f"--fk-html={paths['html']}", f"--fk-cache-dir={paths['cache']}"]),
                                  out)
    data = json.loads(paths["report"].read_text())
    if data["e2e"]["cases"][0]["status"] == "NOT_RUN":
        pytest.skip(data["e2e"]["cases"][0]["message"])
    return result, data, paths


def test_kernel_and_e2e_macroevals_side_by_side(mixtral_run):
    """One run, both scores, each labelled; JSON, HTML and the end-of-run table agree."""
    result, data, paths = mixtral_run
    assert result.ret == 0
    assert [t["name"] for t in data["tasks"]] == ["rms_norm"]  # e2e cases are no kernel task
    k, e = data["macro"]["MacroEval"], data["e2e"]["macro"]["MacroEval"]
    line = (f"kernel-level MacroEval {k:.3f} (C x Cov, no GPU speed) | end-to-end MacroEval {e:.3f} "
            f"(credit x Cov, no GPU speed)   (two separate scores)")
    result.stdout.fnmatch_lines(["KERNEL LEVEL: 1 tasks on cpu*", "END TO END: 1 (model, scenario) cases*",
                                 "*mixtral-8x7b-chat*PASSED*72*7/7*", line])
    assert format_table(data).endswith(line)
    case = data["e2e"]["cases"][0]
    assert case["mutants"]["rope-ignores-positions"]["caught"] and case["min_mutant_margin"] >= 0
    assert set(case["paths"]) == {"prefill-forced", "decode-forced"} and case["path"] in case["paths"]
    assert case["mutants"]["rope-wrong-in-decode"]["kind"] == "decode-path"
    assert data["schema_version"] >= "1.4"
    page = paths["html"].read_text()
    assert "end-to-end MacroEval" in page and "mixtral-8x7b-chat" in page and "rope-ignores-positions" in page
    setters = "/".join(case["paths"][p]["g_run"].split("/")[0] for p in case["paths"])
    assert f"<small>{setters}</small>" in page  # which noise run set each path's floor


# ---- the calibration kept on disk -----------------------------------------------------------------
def _mixtral_cut(rounding: bool = False):
    """The Mixtral CPU cut with one built-in mutant: the cache stores mutants like noise runs, and
    one stands for all (the seven cost four of the test's five calibrations' time); ``rounding``:
    with the rounded noise run, which the CPU profile leaves out."""
    from tasks.e2e import LlmE2E

    class OneMutant(LlmE2E):
        def mutants(self, case=None):
            return dict(list(super().mutants(case).items())[:1])

        def rounding_noise(self, case) -> bool:
            return rounding
    spec = OneMutant()
    return spec, next(c for c in spec.cases("cpu") if c["model"] == "mixtral-8x7b")


def test_a_stored_calibration_is_reused_and_a_corrupt_or_stale_one_recomputed(tmp_path):
    import fk_pytest.e2e_run as e2e_run
    spec, case = _mixtral_cut()
    tree = candidate_lookup(CandidateSource(CANDIDATES / "minimal_signatures"))
    calls, lines = [], []
    real = e2e_run.calibrate

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    def score():
        cache = CalibrationCache(tmp_path, progress=lines.append)
        return run_e2e(spec, case, "cpu", tree, True, cache=cache)

    e2e_run.calibrate = counted
    try:
        first = score()
        entries = list((tmp_path / "e2e").glob("*.json"))
        assert len(calls) == 1 and len(entries) == 1
        second = score()  # a new run: the calibration comes from disk
        assert len(calls) == 1 and any("reused" in line for line in lines)
        assert (second.status, second.d, second.g, second.compared_tokens) == \
            (first.status, first.d, first.g, first.compared_tokens)
        assert len(second.mutants) == 1
        assert {n: m.d for n, m in second.mutants.items()} == {n: m.d for n, m in first.mutants.items()}

        entry = json.loads(entries[0].read_text())  # a flipped target token: digest no longer matches
        scenario = next(iter(entry["payload"].values()))
        scenario["expected"][0][0] += 1
        entries[0].write_text(json.dumps(entry))
        third = score()
        assert len(calls) == 2 and any("does not match its digest" in line for line in lines)
        assert third.d == first.d
        entries[0].write_text("{not json")
        score()
        assert len(calls) == 3 and any("recomputed" in line for line in lines[-3:])

        # Other weights are another key: a new entry, not the old one.
        from tasks import e2e as tasks_e2e
        seed = tasks_e2e.WEIGHT_SEED
        tasks_e2e.WEIGHT_SEED = seed + 1
        try:
            score()
        finally:
            tasks_e2e.WEIGHT_SEED = seed
        assert len(calls) == 4 and len(list((tmp_path / "e2e").glob("*.json"))) == 2
    finally:
        e2e_run.calibrate = real


def test_the_cache_options_reach_the_evaluator(mixtral_run, suite_run):
    first, _, paths = mixtral_run  # run with --fk-cache-dir: the worker writes the entry
    cache = paths["cache"]
    entries = list((cache / "e2e").glob("*.json"))
    assert first.ret == 0 and len(entries) == 1
    # --fk-no-cache neither reads nor writes: on Mamba-2's CPU case (a few seconds where Mixtral's
    # recalibration took 30), first cached (its entry written), then again without the cache.
    select = ["-k", "e2e and mamba2", f"--fk-candidate={ROOT / 'kernels_reference'}"]
    on = suite_run(*select, f"--fk-cache-dir={cache}")
    assert on.ret == 0 and len(list((cache / "e2e").glob("*.json"))) == 2
    written = {p: p.stat().st_mtime_ns for p in (cache / "e2e").glob("*.json")}
    off = suite_run(*select, f"--fk-cache-dir={cache}", "--fk-no-cache")
    assert off.ret == 0 and "calibration reused" not in off.stdout.str()
    assert {p: p.stat().st_mtime_ns for p in (cache / "e2e").glob("*.json")} == written
    again = suite_run(*select, f"--fk-cache-dir={cache}")  # the cache is still read when allowed
    assert again.ret == 0 and "calibration reused" in again.stdout.str()


# ---- random-weight models' local heads -----------------------------------------------------------
def test_random_weight_models_get_one_local_head_per_kv_group_and_mla_is_left_as_drawn():
    import torch
    from kernels_reference.L2.llama_attention import LlamaAttention
    from kernels_reference.L4.llama import init_random_weights, model_for
    from tasks.e2e import E2E as SPEC, LOCAL_HEAD_MIX, WEIGHT_SEED, model_config

    def attention_of(model):
        return next(m for m in model.modules() if isinstance(m, LlamaAttention))

    mixtral = next(c for c in SPEC.cases("cpu") if c["model"] == "mixtral-8x7b")
    attn = attention_of(SPEC.build_reference(mixtral, "cpu"))
    w, group = attn.qkv_proj.weight.detach(), attn.num_heads // attn.num_kv_heads
    q = w[:attn.q_size].view(attn.num_heads, -1)
    k = w[attn.q_size:attn.q_size + attn.kv_size].view(attn.num_kv_heads, -1)
    cos = torch.nn.functional.cosine_similarity(q[:, None], k[None], dim=-1)  # [query head, kv head]
    for j in range(attn.num_kv_heads):
        local = float(cos[j * group, j])  # the group's local head
        assert local > 0.5 and abs(local - LOCAL_HEAD_MIX) < 0.05, local
        others = [h for h in range(attn.num_heads) if h != j * group]
        assert float(cos[others, j].abs().max()) < 0.2  # every other pair stays independent
    assert abs(float(k.std()) * w.shape[1] ** 0.5 - 1.0) < 0.05  # the keys keep their scale

    # DeepSeek-V2's MLA has no LlamaAttention: its weights are exactly the plain draw.
    deepseek = next(c for c in SPEC.cases("cpu") if c["model"] == "deepseek-v2-lite")
    built = SPEC.build_reference(deepseek, "cpu")
    gen = torch.Generator().manual_seed(WEIGHT_SEED)
    plain = init_random_weights(model_for(model_config("deepseek-v2-lite", "cpu")), gen).to(deepseek.dtype)
    assert not any(isinstance(m, LlamaAttention) for m in built.modules())
    assert all(torch.equal(a, b) for a, b in zip(built.state_dict().values(), plain.state_dict().values()))


def test_full_profile_scoring_splits_each_scenario_s_longest_prompt_mid_block():
    """Serving budgets (8192 tokens) take the GPU scenarios' prompts whole; scoring runs them with a
    budget that splits the longest prompt off a KV-block boundary (its second chunk reads the first
    from the cache), while the timed serving budget and the re-batched noise run's own stay."""
    from tasks.e2e import E2E as SPEC
    split = 0
    for case in SPEC.cases("full"):
        args, rebatched = SPEC.engine_args(case), SPEC.rebatched_engine_args(case)
        longest = max(len(p) for p, _ in SPEC.requests(case))
        chunk = args.get("scoring_chunk_tokens")
        assert args["max_num_batched_tokens"] == 8192 and "scoring_chunk_tokens" not in rebatched, case.id
        assert rebatched["max_num_batched_tokens"] == 8192 // 3 + 1
        if longest <= 8192:  # a prompt the serving budget would take whole
            assert chunk is not None and chunk < longest and chunk % args["block_size"], (case.id, chunk)
            split += 1
        else:  # the serving budget splits it already
            assert chunk is None, case.id
    assert split >= 20


def test_calibration_copies_share_the_reference_weights_and_a_candidate_copy_does_not():
    """The noise run's plain-PyTorch twin and a built-in mutant hold the reference's own weight
    tensors (one set of weights in memory however many copies a full-size calibration makes); the
    mutant's swapped module and a composed candidate get their own, so neither can write the
    reference's; the caches an engine bound to the reference are never copied."""
    import torch
    from fk_pytest.build import with_paths
    from fk_pytest.e2e_run import compose_candidate
    from tasks.e2e import E2E as SPEC
    from tasks.mutants import BUILTIN_MUTANTS, RmsNormEpsilonTooLarge

    case = next(c for c in SPEC.cases("cpu") if c["model"] == "mixtral-8x7b")
    reference = SPEC.build_reference(case, "cpu")
    reference.model.layers[0].self_attn.attn.kv_cache = torch.zeros(4)  # as an engine binds it
    ptrs = {n: p.data_ptr() for n, p in reference.named_parameters()}

    native = with_paths(reference, "forward_native", share_parameters=True)
    assert {n: p.data_ptr() for n, p in native.named_parameters()} == ptrs
    assert native.model.layers[0].self_attn.attn.kv_cache is None

    mutant, composition = compose_candidate(reference, BUILTIN_MUTANTS["rms-norm-eps-1000x"].classes.get,
                                            share_parameters=True)
    assert composition.swapped == ["RMSNorm"]
    for name, p in mutant.named_parameters():
        owner = mutant.get_submodule(name.rsplit(".", 1)[0])
        assert (p.data_ptr() == ptrs[name]) != isinstance(owner, RmsNormEpsilonTooLarge), name

    candidate, _ = compose_candidate(reference, candidate_lookup(CandidateSource(ROOT / "kernels_reference")))
    assert not any(p.data_ptr() in ptrs.values() for p in candidate.parameters())


def test_a_swapped_class_is_built_at_the_model_dtype_and_the_composed_copy_owns_each_weight_once():
    """Composing a bf16 model: the tree's classes get their parameters at bf16 as they register
    them (the model class itself is never built whole in float32 beside the reference), buffers
    stay as the constructor made them, and the composed model owns every weight, ties kept."""
    import torch
    from fk_pytest.build import own_parameters, parameters_registered_at
    from fk_pytest.e2e_run import compose_candidate
    from tasks.e2e import E2E as SPEC

    class Tagged(torch.nn.Parameter):
        pass

    class Spy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            w = Tagged(torch.ones(4))
            w.note = "kept"
            self.w, self.same = w, w
            self.seen = self.w.dtype  # as the constructor sees it after registering
            self.lin = torch.nn.Linear(4, 4)  # its own init runs on the registered parameter
            self.register_buffer("table", torch.arange(4.0))

    with parameters_registered_at(torch.bfloat16):
        spy = Spy()
    assert spy.seen == spy.lin.weight.dtype == torch.bfloat16 and spy.table.dtype == torch.float32
    assert type(spy.w) is Tagged and spy.w.note == "kept" and spy.same is spy.w
    assert float(spy.lin.weight.detach().float().abs().sum()) > 0

    owner = torch.nn.Module()
    owner.a, owner.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    owner.b.weight = owner.a.weight  # tied
    copy = torch.nn.Module()
    copy.a, copy.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    copy.a.weight = copy.b.weight = owner.a.weight
    copy.a.bias = owner.a.bias
    mine = copy.b.bias
    own_parameters(copy, owner)
    assert copy.a.weight is copy.b.weight and copy.a.weight is not owner.a.weight
    assert torch.equal(copy.a.weight, owner.a.weight) and copy.a.bias is not owner.a.bias and copy.b.bias is mine

    case = next(c for c in SPEC.cases("cpu") if c["model"] == "mixtral-8x7b")
    reference = SPEC.build_reference(case, "cpu").to(torch.bfloat16)
    ptrs = {p.data_ptr() for p in reference.parameters()}
    from kernels_reference.L1.rms_norm import RMSNorm
    seen = []

    class SpyNorm(RMSNorm):  # what the constructor holds once its parameters are registered
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen.append(self.weight.dtype)

    spied, _ = compose_candidate(reference, lambda cls: SpyNorm if cls is RMSNorm else None)
    assert seen and set(seen) == {torch.bfloat16}
    candidate, composition = compose_candidate(reference, candidate_lookup(CandidateSource(ROOT / "kernels_reference")))
    assert "MixtralForCausalLM" in composition.swapped
    assert all(p.dtype == torch.bfloat16 and p.data_ptr() not in ptrs for p in candidate.parameters())
    assert {n: tuple(p.shape) for n, p in candidate.named_parameters()} == \
        {n: tuple(p.shape) for n, p in reference.named_parameters()}
    example, composition = compose_candidate(reference, candidate_lookup(CandidateSource(ROOT / "examples/candidates/triton")))
    assert composition.swapped and not any(p.data_ptr() in ptrs for p in example.parameters())


@pytest.mark.parametrize("tree, written", [("rms_load_scales_source_in_place", True), ("rms_load_scales_a_copy", False)])
def test_a_class_whose_loading_code_writes_the_reference_weights_is_tampered_and_the_reference_dropped(tree, written):
    """The composed copy shares the reference's weights while the tree's classes load from them:
    a class whose own loading code writes the tensors it is handed (here: doubling them in place)
    is TAMPERED, named, and the calibration cache lets the damaged reference go; the same class
    transforming a copy instead composes as any other."""
    import torch
    from fk_pytest.build import weights_digest
    from fk_pytest.e2e_run import composed_or_verdict
    from tasks.e2e import E2E as SPEC

    class Cache:
        forgot = False

        def forget(self):
            self.forgot = True

    case = next(c for c in SPEC.cases("cpu") if c["model"] == "mixtral-8x7b")
    reference = SPEC.build_reference(case, "cpu")
    before = weights_digest(reference)
    result, cache = E2EResult(case.id, "llm_e2e", "llm", case["model"], case["scenario"]), Cache()
    candidate = composed_or_verdict(result, reference, candidate_lookup(CandidateSource(CANDIDATES / tree)), True, cache)
    assert (weights_digest(reference) != before) == written
    if written:
        assert candidate is None and result.status == status.TAMPERED and cache.forgot, result.message
        assert "RMSNorm" in result.message and "wrote into the reference weights" in result.message
    else:
        assert candidate is not None and result.swapped == ["RMSNorm"] and not cache.forgot, result.message
        x = torch.randn(3, reference.config.hidden_size)
        norm, mine = reference.model.norm, candidate.model.norm
        assert torch.allclose(mine(x), norm(x), atol=1e-6)


def test_the_rounding_noise_run_moves_each_kernel_output_by_at_most_one_unit_and_nothing_else():
    """with_rounding: the leaf kernels' floating outputs of a bf16 model land at most one unit in
    the last place away (about three in ten of them), integer outputs (expert ids) and the
    reference itself stay as they were, the weights are shared, the draws repeat per seed, and a
    module holding kernels (a decoder layer) is not rounded again on top of them."""
    import torch
    from fk_pytest.build import with_rounding
    from kernels_reference.L1.rms_norm import RMSNorm
    from kernels_reference.L1.topk_softmax import TopKSoftmax
    from tasks.e2e import E2E as SPEC

    holder = torch.nn.ModuleDict({"norm": RMSNorm(256), "topk": TopKSoftmax(2)}).to(torch.bfloat16)
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    gates = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
    want, (w_want, ids_want) = holder["norm"](x), holder["topk"](gates)
    twin = with_rounding(holder, seed=3, share_parameters=True)
    got, (w_got, ids_got) = twin["norm"](x), twin["topk"](gates)
    assert torch.equal(ids_got, ids_want)
    moved = got != want
    assert 0.15 < moved.float().mean() < 0.5
    assert ((got.float() - want.float()).abs() <= want.float().abs() * torch.finfo(torch.bfloat16).eps).all()
    assert not torch.equal(w_got, w_want) and torch.allclose(w_got, w_want, rtol=2 ** -23, atol=0)
    assert torch.equal(holder["norm"](x), want)  # the reference untouched
    assert twin["norm"].weight.data_ptr() == holder["norm"].weight.data_ptr()
    assert torch.equal(with_rounding(holder, seed=3)["norm"](x), got)
    assert not torch.equal(with_rounding(holder, seed=4)["norm"](x), got)

    case = next(c for c in SPEC.cases("cpu") if c["model"] == "mixtral-8x7b")
    rounded = with_rounding(SPEC.build_reference(case, "cpu"), share_parameters=True)
    wrapped = {type(m).__name__ for m in rounded.modules() if "forward" in vars(m)}
    assert {"RMSNorm", "Attention", "TopKSoftmax"} <= wrapped
    assert not wrapped & {"LlamaDecoderLayer", "MixtralDecoderLayer", "MixtralForCausalLM", "LlamaAttention"}
    full = {c["model"]: SPEC.rounding_noise(c) for c in SPEC.cases("full")}
    assert full["mixtral-8x7b"] and full["deepseek-v2-lite"] and not full["smollm2-135m"]
    assert not full["llama-3.1-8b"] and not SPEC.rounding_noise(case)  # the CPU cuts run float32


def test_the_rounded_noise_run_joins_the_calibration_where_the_spec_asks_for_it():
    """The wiring, on the CPU: Mixtral's cut with the rounded run asked for scores it on both
    paths beside the other noise runs, and the reference tree keeps full credit and its mutant."""
    spec, case = _mixtral_cut(rounding=True)
    r = run_e2e(spec, case, "cpu", candidate_lookup(CandidateSource(ROOT / "kernels_reference")), True,
                cache=CalibrationCache())
    assert {k.split("/", 1)[1] for k in r.noise if "reference-rounded" in k} == {
        "reference-rounded/" + p for p in PATHS}, sorted(r.noise)
    assert r.status == status.PASSED and r.credit == 1.0 and all(m.caught for m in r.mutants.values()), r.message


def test_deepseeks_expert_id_bug_is_held_to_the_graded_standard_and_mixtrals_to_the_gross_one():
    """DeepSeek-V2-Lite's shared experts carry part of every token's MLP, so an off-by-one expert
    id flips about half of its tokens (0.50-0.56 on an H100): it must fail the case, not take all
    credit. Mixtral has no shared expert: the same bug stays gross there."""
    from fk_pytest.e2e import GRADED, GROSS
    from tasks.e2e import E2E as SPEC

    kinds = {c["model"]: SPEC.mutants(c)["topk-expert-off-by-one"].kind
             for c in SPEC.cases("full") if c["model"] in ("deepseek-v2-lite", "mixtral-8x7b")}
    assert kinds == {"deepseek-v2-lite": GRADED, "mixtral-8x7b": GROSS}


@pytest.mark.parametrize("model", ["mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v2-lite", "qwen3-next-80b-a3b"])
def test_sharp_routers_reaches_every_router_of_each_moe_model(model):
    """Every router of the model (each ``*.gate`` of an MoE block; not Qwen3-Next's shared-expert
    gate) is scaled, so a router scale set for a model reaches all of its layers; a model whose MoE
    block is missing from ``MOE_BLOCKS`` fails here."""
    import torch
    from kernels_reference.L4.llama import init_random_weights, model_for
    from tasks.e2e import model_config, sharp_routers

    net = init_random_weights(model_for(model_config(model, "cpu")), torch.Generator().manual_seed(0))
    routers = {n: m.weight.clone() for n, m in net.named_modules() if n.endswith("mlp.gate")
               or n.endswith("block_sparse_moe.gate")}
    assert routers, f"{model}: no router found"
    sharp_routers(net, 3.0)
    scaled = dict(net.named_modules())
    for name, before in routers.items():
        assert torch.equal(scaled[name].weight, before * 3.0), name
