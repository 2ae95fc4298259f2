"""The kernel-level reference cache (fk_pytest.ref_cache): a second run reuses the reference's side
of every case and gives the same verdicts, a wrong candidate still fails on a warm cache, and an
entry that is corrupt, fails its digest or was measured against another truth is recomputed."""
import json

import pytest

from conftest import CANDIDATES, ROOT
from fk_pytest import status
from fk_pytest.e2e_cache import CACHE_DIR_ENV
from fk_pytest.evaluator import Evaluator, task_ref
from tasks.L1.test_silu_and_mul import TASK

CASES = [c for c in TASK.cases("cpu") if c.dtype.is_floating_point][:3]


def _run(tree, lines=None):
    ev = Evaluator(str(tree), "cpu", progress=(lines.append if lines is not None else None))
    return [ev.evaluate(task_ref(TASK), case, 7, "workload") for case in CASES]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))
    return tmp_path / "ref"


def test_a_second_run_takes_the_reference_side_from_the_cache_with_the_same_verdicts(cache):
    first = _run(ROOT / "kernels_reference")
    assert [r.reference for r in first] == ["run"] * len(CASES)
    assert len(list(cache.glob("*.json"))) == len(CASES)
    second = _run(ROOT / "kernels_reference")
    assert [r.reference for r in second] == ["cache"] * len(CASES)
    assert all("reference" not in r.phases for r in second)  # the reference never ran
    assert [(r.status, [e.ratio for e in r.errors]) for r in second] == \
        [(r.status, [e.ratio for e in r.errors]) for r in first]


def test_a_wrong_candidate_still_fails_on_a_warm_cache(cache):
    _run(ROOT / "kernels_reference")
    wrong = _run(CANDIDATES / "silu_swapped")
    assert [r.reference for r in wrong] == ["cache"] * len(CASES)
    assert all(r.status == status.WRONG_RESULT for r in wrong), [(r.status, r.message) for r in wrong]


def test_a_corrupt_tampered_or_stale_entry_is_recomputed_never_trusted(cache):
    _run(ROOT / "kernels_reference")
    entries = sorted(cache.glob("*.json"))
    entries[0].write_text("{not json")
    entry = json.loads(entries[1].read_text())  # a bar 100x wider, digest left as it was
    entry["payload"]["outputs"][0]["e_ref"] *= 100
    entries[1].write_text(json.dumps(entry))
    from fk_pytest.e2e_cache import _payload_digest
    entry = json.loads(entries[2].read_text())  # measured against another truth (digest consistent)
    entry["payload"]["truth"][0]["norm"] *= 1.01
    entry["sha256"] = _payload_digest(entry["payload"])
    entries[2].write_text(json.dumps(entry))
    lines = []
    again = _run(ROOT / "kernels_reference", lines)
    assert [r.reference for r in again] == ["run"] * len(CASES)
    assert any("not used" in line for line in lines)
    assert any("does not match its digest" in line for line in lines)
    assert any("stale" in line for line in lines)
    assert [r.reference for r in _run(ROOT / "kernels_reference")] == ["cache"] * len(CASES)  # rewritten


def test_without_a_cache_directory_nothing_is_read_or_written(tmp_path, monkeypatch):
    monkeypatch.delenv(CACHE_DIR_ENV, raising=False)
    assert Evaluator(None, "cpu").ref_cache is None
    assert [r.reference for r in _run(ROOT / "kernels_reference")] == ["run"] * len(CASES)
    assert not list(tmp_path.iterdir())


def _speed(tree, monkeypatch, cache_dir, task=TASK, cases=CASES):
    """measure_speed with the reference cache, its GPU-only caching switched on for the CPU (the
    code path a GPU runs: the reference's timing and timed-path errors stored, then reused)."""
    from fk_pytest import speed
    from fk_pytest.candidates import CandidateSource
    from fk_pytest.ref_cache import ReferenceCache
    monkeypatch.setattr(speed, "timings_cacheable", lambda device: True)
    cls = CandidateSource(str(tree)).load_class(task)
    cache = ReferenceCache(cache_dir, progress=lambda text: None)
    return [speed.measure_speed(task, case, cls, "cpu", 11, cache=cache) for case in cases]


def test_a_cached_timing_is_reused_and_the_timed_path_still_checked(tmp_path, monkeypatch):
    from fk_pytest.errors import CandidateError
    first = _speed(ROOT / "kernels_reference", monkeypatch, tmp_path)
    assert [r.reference for r in first] == ["run"] * len(CASES)
    second = _speed(CANDIDATES / "minimal_signatures", monkeypatch, tmp_path)
    assert [r.reference for r in second] == ["cache"] * len(CASES)
    assert [r.ref_us for r in second] == [r.ref_us for r in first]  # the stored time, not a new one
    with pytest.raises(CandidateError) as caught:  # a wrong timed path, judged on the stored bar
        _speed(CANDIDATES / "silu_swapped", monkeypatch, tmp_path)
    assert caught.value.status == status.TIMED_OUTPUT_WRONG


def test_one_runner_with_a_fixed_k_stops_on_its_own_median(monkeypatch):
    """The GPU loop with only the candidate (its reference from the cache), on fake CUDA events:
    the stored K is used, and the rounds stop once its own median is known to +-1%."""
    import random
    from fakes.gpu_loop import Runner, fake_events
    from fk_pytest import timing

    rng = random.Random(0)
    # Made in this order: 4 one-call estimates, 500 one-call rounds, 500 K-call rounds; a one-call
    # replay 10 us, a call 2 us more, 1% noise on each replay.
    fake_events(monkeypatch, lambda n: (10.0 if n <= 504 else 10.0 + 2.0 * 6) * (1 + rng.gauss(0, 0.01)))
    runner = Runner()
    out = timing.time_pair_cuda({"candidate": runner}, lambda: None, budget_s=10.0, min_rounds=50,
                                max_rounds=500, more_sets=lambda n: [{}] * n, target_ci=0.01, calls=7)
    cand = out["candidate"]
    assert runner.calls == 7 and cand.calls == 7
    assert 50 <= cand.rounds < 500 and cand.median_ci is not None and cand.median_ci <= 0.01
    assert abs(cand.median_us - 2.0) < 0.1  # the marginal cost of a call


def test_undetermined_rows_and_their_draw_come_from_the_cache_too(cache, monkeypatch):
    """Finding an MoE case's undetermined rows runs the reference at the case dtype (for a model,
    a second model): a warm entry supplies the rows and the input draw, and the verdict is the same."""
    from tasks.L3.test_mixtral_decoder_layer import TASK as LAYER
    case = LAYER.cases("cpu")[0]
    calls = []
    rule = type(LAYER).undetermined_rows

    def counted(self, *args):
        calls.append(1)
        return rule(self, *args)
    monkeypatch.setattr(type(LAYER), "undetermined_rows", counted)

    def run():
        ev = Evaluator(str(ROOT / "kernels_reference"), "cpu")
        return ev.evaluate(task_ref(LAYER), case, 3, "workload")
    first = run()
    assert first.reference == "run" and len(calls) == 1
    second = run()
    assert second.reference == "cache" and len(calls) == 1  # the rows came with the entry
    assert (second.status, second.excluded, [e.ratio for e in second.errors]) == \
        (first.status, first.excluded, [e.ratio for e in first.errors])


def test_a_cached_timing_carries_the_timed_checks_undetermined_rows(tmp_path, monkeypatch):
    from tasks.L3.test_mixtral_decoder_layer import TASK as LAYER
    cases = LAYER.cases("cpu")[:1]
    calls = []
    rule = type(LAYER).undetermined_rows
    monkeypatch.setattr(type(LAYER), "undetermined_rows", lambda self, *a: calls.append(1) or rule(self, *a))
    first = _speed(ROOT / "kernels_reference", monkeypatch, tmp_path, LAYER, cases)
    runs = len(calls)
    second = _speed(ROOT / "kernels_reference", monkeypatch, tmp_path, LAYER, cases)
    assert [r.reference for r in (first + second)] == ["run", "cache"]
    # The first run found the rows for the timed-path check (and for the CPU's check of each timed
    # call, which pairs the candidate's calls with the reference's and so has none to check when
    # the reference's timing is cached: on a GPU there is no such check, on the CPU no caching).
    assert runs >= 1 and len(calls) == runs

def test_the_key_covers_the_whole_task_package(tmp_path, monkeypatch):
    """A change to a module beside the task's level folder (tasks/dense.py builds its inputs)
    must give another key, not only a change in tasks/L1."""
    import torch
    from fk_pytest import e2e_cache, ref_cache
    case = CASES[0]
    before = ref_cache.case_key(TASK, case, 1, "workload", torch.device("cpu"))
    seen = []
    real = e2e_cache._tree_digest.__wrapped__

    def digest(roots):
        seen.append(roots)
        return real(roots)
    monkeypatch.setattr(e2e_cache, "_tree_digest", digest)
    ref_cache.case_key(TASK, case, 1, "workload", torch.device("cpu"))
    assert any(r.name == "tasks" and (r / "dense.py").exists() for roots in seen for r in roots)
    assert before["source"] == ref_cache.case_key(TASK, case, 1, "workload", torch.device("cpu"))["source"]


def test_a_suspect_reference_error_in_a_valid_entry_is_not_taken_from_the_cache(cache):
    """An entry whose digest is right but whose reference error is above REFERENCE_SUSPECT (kept
    before the native check, or by a reference since fixed): the reference runs again, and the
    native check sees its real error."""
    from fk_pytest.e2e_cache import _payload_digest
    _run(ROOT / "kernels_reference")
    path = sorted(cache.glob("*.json"))[0]
    entry = json.loads(path.read_text())
    entry["payload"]["outputs"][0]["e_ref"] = 0.5
    entry["sha256"] = _payload_digest(entry["payload"])
    path.write_text(json.dumps(entry))
    again = _run(ROOT / "kernels_reference")
    assert sorted(r.reference for r in again) == ["cache", "cache", "run"]
    assert all(r.status == status.PASSED for r in again)
