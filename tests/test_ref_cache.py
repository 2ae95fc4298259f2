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
