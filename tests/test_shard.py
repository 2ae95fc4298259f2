"""--fk-shard=i/N splits the suite deterministically by whole tasks; fk-report --merge gives back
one run's report."""
import copy
import json

import pytest

from fk_pytest.merge import MergeError, merge_reports
from fk_pytest.report import main as fk_report
from fk_pytest.shard import assign, parse_shard

SELECT = "(rms_norm or silu_and_mul or rotary_emb) and not deepseek and not gemma and not gated and correctness and decode-T1-"
TIMING_KEYS = {"seconds", "seconds_by_kind", "phases", "speed", "informational_cpu_speedup"}  # wall-clock: differs run to run


def test_parse_shard_names_what_is_wrong():
    assert parse_shard("2/4") == (2, 4)
    for bad in ("0/4", "5/4", "1/0", "a/b", "3"):
        with pytest.raises(ValueError, match="--fk-shard"):
            parse_shard(bad)


def test_assign_is_deterministic_balanced_and_follows_costs():
    groups = {f"task:t{i}": n for i, n in enumerate([40, 30, 20, 10, 10, 5, 5])}
    where = assign(groups, 3)
    assert where == assign(dict(reversed(list(groups.items()))), 3)  # order of discovery is irrelevant
    load = [sum(n for g, n in groups.items() if where[g] == s) for s in (1, 2, 3)]
    assert max(load) - min(load) <= 10 and sorted(set(where.values())) == [1, 2, 3]
    # Measured seconds outweigh test counts: the 5-test group that took longest gets a shard alone.
    costs = {g: 1.0 for g in groups} | {"task:t6": 500.0}
    by_cost = assign(groups, 2, costs)
    assert [g for g in groups if by_cost[g] == by_cost["task:t6"]] == ["task:t6"]


def _strip(report):
    return [{k: v for k, v in t.items() if k not in TIMING_KEYS} for t in report["tasks"]]


def test_merged_shards_equal_one_run(suite_run, tmp_path):
    whole = tmp_path / "whole.json"
    assert suite_run("-k", SELECT, f"--fk-report={whole}").ret == 0
    shards = [tmp_path / f"s{i}.json" for i in (1, 2)]
    for i, path in enumerate(shards, 1):
        assert suite_run("-k", SELECT, f"--fk-shard={i}/2", f"--fk-report={path}").ret == 0
    merged_path = tmp_path / "merged.json"
    assert fk_report(["--merge", *map(str, shards), "-o", str(merged_path)]) == 0
    single, merged = json.loads(whole.read_text()), json.loads(merged_path.read_text())
    parts = [{t["name"] for t in json.loads(p.read_text())["tasks"]} for p in shards]
    assert parts[0] and parts[1] and not parts[0] & parts[1]  # whole tasks, each on one shard
    assert parts[0] | parts[1] == {t["name"] for t in single["tasks"]} and len(single["tasks"]) == 3
    assert _strip(merged) == _strip(single)
    assert merged["macro"] == single["macro"] and merged["complete"]
    assert set(merged["phases"]) >= {"build", "truth", "reference", "candidate", "compare"}
    assert merged["run"]["merged_from"] == ["1/2", "2/2"]


def _shard_report(index, count, tasks=("a",), seed=None):
    return {"schema": "fastkernels.report/1", "complete": True, "environment": {"torch": "x", "device": "cpu"},
            "run": {"device": "cpu", "seed": seed, "shard": f"{index}/{count}", "candidate": None},
            "tasks": [{"name": n, "level": 1, "family": "norm", "valid": True, "S_t": None, "C_t": 1.0,
                       "cases_total": 1} for n in tasks], "macro": {}}


@pytest.mark.parametrize("reports, message", [
    ([_shard_report(1, 3, ["a"]), _shard_report(2, 3, ["b"])], "missing 3/3"),
    ([_shard_report(1, 2, ["a"]), _shard_report(1, 2, ["b"])], "given twice 1/2"),
    ([_shard_report(1, 2, ["a"]), _shard_report(2, 2, ["a"])], "task a is in another shard"),
    ([_shard_report(1, 2, ["a"]), _shard_report(2, 2, ["b"], seed=7)], "'seed' is 7"),
    ([_shard_report(1, 2, ["a"]), dict(_shard_report(2, 2, ["b"]), run={"device": "cpu", "seed": None,
                                                                          "candidate": None})], "not a shard"),
])
def test_merge_refuses_what_is_not_one_run(reports, message):
    with pytest.raises(MergeError, match=message):
        merge_reports(copy.deepcopy(reports), [f"r{i}.json" for i in range(len(reports))])


def test_fk_report_without_merge_refuses_two_reports(tmp_path, capsys):
    paths = []
    for i in (1, 2):
        paths.append(tmp_path / f"s{i}.json")
        paths[-1].write_text(json.dumps(_shard_report(i, 2, [f"t{i}"])))
    with pytest.raises(SystemExit):
        fk_report([str(p) for p in paths])
    assert "add --merge" in capsys.readouterr().err


def test_costs_kept_in_the_cache_directory_price_shards_and_files(tmp_path):
    """A run with --fk-cache-dir leaves its seconds per group in DIR/costs.json, per device; the next
    run on that device packs shards and orders xdist's files by them, longest first."""
    from types import SimpleNamespace
    from fk_pytest.shard import file_prices, remember_costs, remembered_costs

    report = {"tasks": [{"name": "slow", "seconds": 90.0}, {"name": "quick", "seconds": 3.0}],
              "e2e": {"cases": [{"model": "m", "seconds": 40.0}, {"model": "m", "seconds": 20.0}]}}
    remember_costs(tmp_path, "NVIDIA H200", report)
    remember_costs(tmp_path, "cpu", {"tasks": [{"name": "slow", "seconds": 1.0}]})
    costs = remembered_costs(tmp_path, "NVIDIA H200")
    assert costs == {"task:slow": 90.0, "task:quick": 3.0, "e2e:m": 60.0}
    assert remembered_costs(tmp_path, "cpu") == {"task:slow": 1.0}  # another device: its own numbers
    remember_costs(tmp_path, "NVIDIA H200", {"tasks": [{"name": "quick", "seconds": 5.0}]})
    assert remembered_costs(tmp_path, "NVIDIA H200")["task:quick"] == 5.0  # newer replaces, others kept
    (tmp_path / "costs.json").write_text("{not json")
    assert remembered_costs(tmp_path, "NVIDIA H200") == {}  # a bad file costs balance, never the run

    def item(path, task):
        fn = SimpleNamespace(_fk_task=SimpleNamespace(name=task))
        return SimpleNamespace(nodeid=f"{path}::test_x", function=fn)
    items = [item("a.py", "quick")] * 50 + [item("b.py", "slow")] * 2 + [item("c.py", "new")] * 10
    price = file_prices(items, {"task:slow": 90.0, "task:quick": 3.0})
    assert sorted(price, key=lambda f: -price[f]) == ["b.py", "c.py", "a.py"]  # new: mean s per test
    assert assign({"task:slow": 2, "task:quick": 50}, 2, {"task:slow": 90.0, "task:quick": 3.0}) == \
        {"task:slow": 1, "task:quick": 2}
