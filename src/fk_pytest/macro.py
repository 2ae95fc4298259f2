"""MacroEval at kernel level: per task, per family, and the macro score (DESIGN "MacroEval").

Per task: C_t (share of cases passed), valid (every case passed), S_t (speedup, valid tasks only).
Per family: S_f = geomean of S_t over valid members, C_f = mean C_t, Cov_f = share of members valid.
Macro: S = geomean of S_f over families with a valid timed member, C and Cov = means over families,
MacroEval = S x C x Cov. When no speed was measured on a GPU (a CPU run), S is reported as missing
and the score uses S = 1: it then measures correctness and coverage only, and says so.
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Dict, Iterable, List, Optional

from .results import TaskRecord


def geomean(values: List[float]) -> Optional[float]:
    values = [v for v in values if v is not None and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def macro_eval(records: Iterable[TaskRecord]) -> dict:
    by_family: Dict[str, List[TaskRecord]] = defaultdict(list)
    for rec in records:
        by_family[rec.family].append(rec)
    families = {}
    for fam, members in sorted(by_family.items()):
        valid = [m for m in members if m.valid]
        families[fam] = {
            "tasks": [m.name for m in members],
            "S_f": geomean([m.speedup for m in valid]),
            "C_f": sum(m.correctness for m in members) / len(members),
            "Cov_f": len(valid) / len(members),
            "valid": len(valid),
        }
    timed = [f["S_f"] for f in families.values() if f["S_f"] is not None]
    n = len(families)
    S = geomean(timed)
    C = sum(f["C_f"] for f in families.values()) / n if n else 0.0
    Cov = sum(f["Cov_f"] for f in families.values()) / n if n else 0.0
    speed_measured = S is not None
    score = (S if speed_measured else 1.0) * C * Cov
    all_tasks = [rec for members in by_family.values() for rec in members]
    return {
        "families": families,
        "S": S, "C": C, "Cov": Cov, "MacroEval": score,
        "speed_measured": speed_measured,
        "fast_1": (sum(1 for r in all_tasks if r.speedup is not None and r.speedup > 1.0)
                   / len(all_tasks) if all_tasks else 0.0),
        "note": _note(speed_measured, all_tasks),
    }


def _note(speed_measured: bool, tasks: List[TaskRecord]) -> Optional[str]:
    notes = []
    if tasks and not any(t.n_cases for t in tasks):
        notes.append("no correctness case ran in this selection (e.g. --benchmark-only), so no task "
                     "is valid: C and Cov are 0 by definition")
    if not speed_measured:
        notes.append("no GPU timing in this run: S is not measured and MacroEval = C x Cov (S taken as 1)")
    return "; ".join(notes) or None
