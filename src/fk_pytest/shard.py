"""``--fk-shard=i/N``: the suite split over N machines, deterministically, and merged afterwards.

Any job runner (a SLURM array, a CI matrix, a shell loop) starts N runs with the same command and
``--fk-shard=1/N`` ... ``N/N``; each keeps its share of the selected tests and writes its own report;
``fk-report --merge`` turns the N reports into one (:mod:`fk_pytest.merge`). No scheduler of our
own: every shard computes the same split from the same collection.

A task's tests stay together (verdicts that span its cases, such as a crash ending the task or a
replayed output, need one process), and an end-to-end model's cases stay together (they share its
reference run and noise floor). Groups are packed longest first onto the least loaded shard; a
group's cost is its seconds in an earlier report (``--fk-shard-costs``), or those an earlier run
on the same device left in the cache directory (``--fk-cache-dir``: DIR/costs.json), or else its
test count.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional, Tuple


def parse_shard(text: str) -> Tuple[int, int]:
    """``"2/4"`` -> (2, 4): shard 2 of 4, counted from 1."""
    try:
        index, count = (int(v) for v in text.split("/"))
    except ValueError:
        raise ValueError(f"--fk-shard={text}: expected i/N with whole numbers, e.g. 1/4") from None
    if count < 1 or not 1 <= index <= count:
        raise ValueError(f"--fk-shard={text}: i must be between 1 and N (N >= 1)")
    return index, count


def group_of(item) -> str:
    """What must run on one machine: the task, the end-to-end model, or else the test module."""
    fn = getattr(item, "function", None)
    task = getattr(fn, "_fk_task", None)
    if task is not None:
        return f"task:{task.name}"
    if getattr(fn, "_fk_e2e", None) is not None and hasattr(item, "callspec"):
        return f"e2e:{item.callspec.params['case']['model']}"
    return f"module:{item.nodeid.split('::')[0]}"


def costs_from_report(path: str) -> Dict[str, float]:
    """Seconds per group, from a report that an earlier run wrote with ``--fk-report``."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--fk-shard-costs={path}: not a readable JSON report ({exc})") from None
    return report_costs(data.get("fastkernels", data))


# ---- measured costs kept in the cache directory -----------------------------------------------------
# A run with --fk-cache-dir leaves its seconds per group in DIR/costs.json, per device (a GPU's
# name, or "cpu"); the next run on that device packs shards and orders xdist's files by them.

def costs_file(root) -> Path:
    return Path(root) / "costs.json"


def remembered_costs(root, device: str) -> Dict[str, float]:
    """The seconds per group earlier runs on ``device`` measured; {} when there are none (or the
    file does not parse: costs only order the work, so a bad file costs balance, never a verdict)."""
    try:
        data = json.loads(costs_file(root).read_text())
        return {g: float(s) for g, s in data.get(device, {}).items()}
    except (OSError, ValueError, AttributeError, TypeError):
        return {}


def remember_costs(root, device: str, report: dict) -> None:
    """Add this run's seconds per group to DIR/costs.json (groups it ran replace older numbers)."""
    path = costs_file(root)
    try:
        data = json.loads(path.read_text())
        data = data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        data = {}
    data[device] = {**data.get(device, {}), **report_costs(report)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    tmp.replace(path)


def report_costs(report: dict) -> Dict[str, float]:
    costs: Dict[str, float] = defaultdict(float)
    for t in report.get("tasks", []):
        if t.get("seconds"):
            costs[f"task:{t['name']}"] += t["seconds"]
    for c in (report.get("e2e") or {}).get("cases", []):
        if c.get("seconds"):
            costs[f"e2e:{c['model']}"] += c["seconds"]
    return dict(costs)


def assign(groups: Dict[str, int], count: int, costs: Optional[Dict[str, float]] = None) -> Dict[str, int]:
    """Group -> shard (1..count). ``groups`` maps each group to its number of tests; a group that
    ``costs`` does not know is priced at the known groups' mean seconds per test."""
    price = assign_prices(groups, costs)
    load = [0.0] * count
    where = {}
    for g in sorted(groups, key=lambda g: (-price[g], g)):  # longest first; names break ties
        shard = min(range(count), key=lambda i: (load[i], i))
        where[g] = shard + 1
        load[shard] += price[g]
    return where


def split(items: List, index: int, count: int, costs: Optional[Dict[str, float]] = None) -> Tuple[List, List]:
    """(kept, deselected) for shard ``index`` of ``count``, the collection's order kept."""
    sizes: Dict[str, int] = defaultdict(int)
    for item in items:
        sizes[group_of(item)] += 1
    where = assign(dict(sizes), count, costs)
    kept = [i for i in items if where[group_of(i)] == index]
    return kept, [i for i in items if where[group_of(i)] != index]


def file_prices(items: List, costs: Dict[str, float]) -> Dict[str, float]:
    """Seconds per test file (the unit xdist's --dist loadfile hands out), from the groups' costs;
    a group with no measured cost is priced at the measured groups' mean seconds per test."""
    tests = defaultdict(int)
    files: Dict[str, set] = defaultdict(set)
    for item in items:
        g = group_of(item)
        tests[g] += 1
        files[item.nodeid.split("::")[0]].add(g)
    price = assign_prices(dict(tests), costs)
    return {f: sum(price[g] for g in gs) for f, gs in files.items()}


def assign_prices(groups: Dict[str, int], costs: Optional[Dict[str, float]]) -> Dict[str, float]:
    costs = costs or {}
    known = [g for g in groups if g in costs]
    per_test = (sum(costs[g] for g in known) / sum(groups[g] for g in known)) if known else 1.0
    return {g: costs.get(g, groups[g] * per_test) if costs else float(groups[g]) for g in groups}
