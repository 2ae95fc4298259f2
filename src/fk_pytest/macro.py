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


def e2e_macro_eval(results: Iterable) -> dict:
    """MacroEval end to end (DESIGN "MacroEval"), over the e2e cases that ran.

    Member = one model: its credit is the mean credit over its scenarios, it is valid when every
    scenario is (credit >= 0.9), and its speedup is the geomean of the scenarios' blended GPU
    speedups (valid members only). Family (``llm``: every Llama-architecture decoder LLM):
    S_f = geomean over valid members, C_f = mean credit, Cov_f = share valid. Macro as at kernel
    level: MacroEval = S x C x Cov, S taken as 1 (and reported missing) without GPU timings.
    A case that is NOT_RUN or INSENSITIVE (it could not see a built-in mutant) is left out;
    NOT_ATTEMPTED counts (credit 0, not valid).
    """
    by_model: Dict[tuple, List] = defaultdict(list)
    insensitive = []
    for r in results:
        if r.status == "INSENSITIVE":
            insensitive.append(r.case_id)
        elif r.status != "NOT_RUN":
            by_model[(r.family, r.model)].append(r)
    by_family: Dict[str, List[dict]] = defaultdict(list)
    for (family, model), cases in sorted(by_model.items()):
        valid = all(c.valid for c in cases)
        by_family[family].append({
            "model": model, "scenarios": [c.scenario for c in cases], "valid": valid,
            "credit": sum(c.credit for c in cases) / len(cases),
            "S_m": geomean([c.speedup for c in cases]) if valid and all(c.speedup for c in cases) else None,
        })
    families = {}
    for fam, members in sorted(by_family.items()):
        valid = [m for m in members if m["valid"]]
        families[fam] = {"models": members, "S_f": geomean([m["S_m"] for m in valid]),
                         "C_f": sum(m["credit"] for m in members) / len(members),
                         "Cov_f": len(valid) / len(members), "valid": len(valid)}
    n = len(families)
    S = geomean([f["S_f"] for f in families.values()])
    C = sum(f["C_f"] for f in families.values()) / n if n else 0.0
    Cov = sum(f["Cov_f"] for f in families.values()) / n if n else 0.0
    timed = any(getattr(r, "speedup_blended", None) and not getattr(r, "informational", True)
                for cases in by_model.values() for r in cases)
    notes = []
    if S is None and n:
        notes.append("no valid model: S has no member to average and MacroEval = C x Cov (= 0)" if timed else
                     "no GPU timing end to end: S is not measured and MacroEval = C x Cov (S taken as 1)")
    if insensitive:
        notes.append(f"left out as INSENSITIVE (a built-in mutant still earned credit there): "
                     f"{', '.join(insensitive)}")
    note = "; ".join(notes) or None
    return {"families": families, "S": S, "C": C, "Cov": Cov,
            "MacroEval": (S if S is not None else 1.0) * C * Cov, "speed_measured": timed, "note": note}
