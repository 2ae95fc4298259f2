"""Merge the reports of ``--fk-shard=i/N`` runs into the report one run would have written.

The shards must describe one run: the same suite, candidate, device, profile, mode and seed, each
shard of one split exactly once. Tasks and end-to-end cases are taken from the shard that ran
them (a group runs on one shard only) and the MacroEvals are computed again over the union, by
the same functions that compute them at the end of a run.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import List

from .macro import e2e_macro_eval, macro_eval
from .phases import total

# What must be equal in every shard for the union to be one run (run settings and environment).
SAME_RUN = ("device", "mode", "profile", "seed", "isolation", "e2e_scale", "candidate", "suite", "effort")
SAME_ENVIRONMENT = ("torch", "triton", "device", "gpu", "driver", "triton_interpreter")


class MergeError(ValueError):
    pass


class _TaskView:
    """What :func:`macro_eval` reads of a task, from the task's JSON."""

    def __init__(self, t: dict):
        self.name, self.family, self.valid = t["name"], t["family"], t["valid"]
        self.speedup, self.correctness, self.n_cases = t["S_t"], t["C_t"], t["cases_total"]


def merge_reports(reports: List[dict], names: List[str]) -> dict:
    if not reports:
        raise MergeError("no report to merge")
    first = reports[0]
    shards = []
    for report, name in zip(reports, names):
        for key in SAME_RUN:
            if report["run"].get(key) != first["run"].get(key):
                raise MergeError(f"{name}: run setting {key!r} is {report['run'].get(key)!r}, "
                                 f"but {first['run'].get(key)!r} in {names[0]}: not shards of one run")
        for key in SAME_ENVIRONMENT:
            if report["environment"].get(key) != first["environment"].get(key):
                raise MergeError(f"{name}: environment {key!r} is {report['environment'].get(key)!r}, "
                                 f"but {first['environment'].get(key)!r} in {names[0]}")
        shards.append(report["run"].get("shard"))
    _check_split(shards, names)
    tasks, cases = {}, {}
    for report, name in zip(reports, names):
        for t in report["tasks"]:
            if t["name"] in tasks:
                raise MergeError(f"{name}: task {t['name']} is in another shard too")
            tasks[t["name"]] = t
        for c in (report.get("e2e") or {}).get("cases", []):
            if c["case_id"] in cases:
                raise MergeError(f"{name}: end-to-end case {c['case_id']} is in another shard too")
            cases[c["case_id"]] = c
    ordered = sorted(tasks.values(), key=lambda t: (t["level"], t["family"], t["name"]))
    merged = dict(first, tasks=ordered, macro=macro_eval([_TaskView(t) for t in ordered]),
                  complete=all(r.get("complete", False) for r in reports),
                  run=dict(first["run"], shard=None, merged_from=[s for s in shards]))
    merged["phases"] = total(t.get("phases") for t in ordered)
    merged.pop("e2e", None)
    if cases:
        e2e = sorted(cases.values(), key=lambda c: (c["family"], c["model"], c["scenario"]))
        merged["e2e"] = {"cases": e2e, "macro": e2e_macro_eval([SimpleNamespace(**c) for c in e2e])}
    return merged


def _check_split(shards: List, names: List[str]) -> None:
    """Every shard i/N of one N, each once."""
    if any(s is None for s in shards):
        name = names[shards.index(None)]
        raise MergeError(f"{name}: not a shard (run without --fk-shard)")
    counts = {s.split("/")[1] for s in shards}
    if len(counts) != 1:
        raise MergeError(f"the reports come from different splits: {', '.join(sorted(set(shards)))}")
    n = int(counts.pop())
    seen = sorted(int(s.split("/")[0]) for s in shards)
    missing = sorted(set(range(1, n + 1)) - set(seen))
    twice = sorted({i for i in seen if seen.count(i) > 1})
    if missing or twice:
        raise MergeError("shards of " + str(n) + ": " + "; ".join(
            ([f"missing {', '.join(f'{i}/{n}' for i in missing)}"] if missing else []) +
            ([f"given twice {', '.join(f'{i}/{n}' for i in twice)}"] if twice else [])))
