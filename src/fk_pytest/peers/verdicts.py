"""Verdicts: the best peer and the ratio of one case, and per op the ratio target and the reference's
bandwidth targets, each said to hold or not."""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

from ..macro import geomean
from ..task import Case
from .contract import PEER_KINDS, PRODUCTION, REFERENCE, Target

# Done-when of the peer benchmark (per op): the reference is at least as fast as the best peer on
# geomean over the shapes, and no single shape is more than 10% slower.
RATIO_GEOMEAN_TARGET = 1.0
RATIO_SHAPE_FLOOR = 0.9
# The timing method's noise: the reference timed against an identical copy of itself lands within
# +-3% (docs/perf/h200-l1.md). A miss by less is said to be within noise; the target stays strict.
TIMING_NOISE = 0.03


def case_verdict(impls: Dict[str, Dict[str, Any]], kinds: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """Best peer = the fastest peer that ran correctly; ratio = its time / the reference's time.
    With ``kinds`` (peer name -> kind), also ``by_kind``: the same per kind of peer."""
    timed = {n: r for n, r in impls.items() if n != REFERENCE and r.get("status") == "ok" and r.get("us")}
    ref = impls.get(REFERENCE, {})
    ref_us = ref["us"] if ref.get("status") == "ok" and ref.get("us") else None

    def best_of(names):
        if not names:
            return {"best_peer": None, "best_peer_us": None, "ratio": None}
        best = min(names, key=lambda n: timed[n]["us"])
        return {"best_peer": best, "best_peer_us": timed[best]["us"],
                "ratio": timed[best]["us"] / ref_us if ref_us else None}

    out = best_of(list(timed))
    if kinds is not None:
        out["by_kind"] = {kind: best_of([n for n in timed if kinds.get(n) == kind]) for kind in PEER_KINDS}
    return out



def op_summary(cases: Sequence[Dict[str, Any]], targets: Sequence[Target], case_of: Dict[str, Case],
               informational: bool, shape_floor: Optional[float] = None,
               production_floor: Optional[float] = None) -> Dict[str, Any]:
    """Ratio target, production target (with ``production_floor``) and bandwidth targets of one op,
    each ``held`` True/False (None: nothing to judge)."""
    floor = RATIO_SHAPE_FLOOR if shape_floor is None else shape_floor
    ratios = [(c["ratio"], c["case"]) for c in cases if c.get("ratio") is not None]
    geo = geomean([r for r, _ in ratios])
    low = min(ratios, default=(None, None))
    ratio_held = None if not ratios else bool(geo >= RATIO_GEOMEAN_TARGET and low[0] >= floor)
    within_noise = None if not ratios else bool(geo >= RATIO_GEOMEAN_TARGET * (1 - TIMING_NOISE)
                                                and low[0] >= floor * (1 - TIMING_NOISE))
    judged = []
    for target in targets:
        values = [(c["impls"][REFERENCE].get(target.metric), c["case"]) for c in cases
                  if c["case"] in case_of and target.applies(case_of[c["case"]])]
        measured = [(v, cid) for v, cid in values if v is not None]
        worst = min(measured, default=(None, None))
        held = bool(worst[0] >= target.min_bw_frac) if measured and len(measured) == len(values) else None
        note = ("no case of this run applies" if not values else
                "no roofline (timings are informational)" if not measured else "")
        judged.append({"name": target.name, "min_bw_frac": target.min_bw_frac, "metric": target.metric,
                       "cases": len(values),
                       "worst_bw_frac": worst[0], "worst_case": worst[1], "held": held, "note": note})
    by_kind = {}
    for kind in PEER_KINDS:
        per = [(c["by_kind"][kind]["ratio"], c["case"]) for c in cases
               if c.get("by_kind", {}).get(kind, {}).get("ratio") is not None]
        low_kind = min(per, default=(None, None))
        by_kind[kind] = {"cases_with_ratio": len(per), "geomean_ratio": geomean([r for r, _ in per]),
                         "min_ratio": low_kind[0], "min_ratio_case": low_kind[1]}
    checks = [ratio_held] + [t["held"] for t in judged]
    out = {"cases_with_ratio": len(ratios), "ratio_to_best_peer": geo, "by_kind": by_kind,
           "geomean_ratio": geo, "min_ratio": low[0], "min_ratio_case": low[1],
           "ratio_target": {"geomean_min": RATIO_GEOMEAN_TARGET, "shape_min": floor, "held": ratio_held,
                            "within_noise": within_noise, "noise": TIMING_NOISE},
           "targets": judged, "informational": informational}
    if production_floor is not None:
        # Judged only where a production peer ran: an op whose production peers are all missing
        # from this machine has nothing to hold against them (None), not a pass.
        prod = by_kind[PRODUCTION]
        held = None if not prod["cases_with_ratio"] else bool(prod["min_ratio"] >= production_floor)
        out["production_target"] = {"case_min": production_floor, "held": held, "min_ratio": prod["min_ratio"],
                                    "min_ratio_case": prod["min_ratio_case"]}
        checks.append(held)
    out["all_held"] = None if any(c is None for c in checks) else all(checks)
    return out
