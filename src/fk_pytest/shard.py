"""``--fk-shard=i/N``: the suite split over N machines, deterministically, and merged afterwards.

Any job runner (a SLURM array, a CI matrix, a shell loop) starts N runs with the same command and
``--fk-shard=1/N`` ... ``N/N``; each keeps its share of the selected tests and writes its own report;
``fk-report --merge`` turns the N reports into one (:mod:`fk_pytest.merge`). No scheduler of our
own: every shard computes the same split from the same collection.

A task's tests stay together (verdicts that span its cases, such as a crash ending the task or a
replayed output, need one process), and an end-to-end model's cases stay together (they share its
reference run and noise floor). Groups are packed longest first onto the least loaded shard; a
group's cost is its seconds in an earlier report (``--fk-shard-costs``), or else its test count.
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
    report = data.get("fastkernels", data)
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
    costs = costs or {}
    known = [g for g in groups if g in costs]
    per_test = (sum(costs[g] for g in known) / sum(groups[g] for g in known)) if known else 1.0
    price = {g: costs.get(g, groups[g] * per_test) if costs else float(groups[g]) for g in groups}
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
