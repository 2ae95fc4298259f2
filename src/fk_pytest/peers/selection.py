"""Which cases of an op the peer benchmark runs: filtered, deduplicated across models, ``-k``-selected,
and under a cap ordered so the first few still cover the op's targets and its cost range."""
from __future__ import annotations

import dataclasses
import json
from typing import Dict, List, Optional, Sequence

from ..task import DTYPE_NAMES, Case, Task
from .contract import OpPeers, Target


@dataclasses.dataclass
class Selected:
    case: Case
    same_as: List[str]  # ids of cases with identical shapes from other models (measured once)
    order: int  # position in the task's own case list (tables keep the task's order)


def shape_key(task: Task, case: Case) -> str:
    """Cases that build the same module and the same inputs except for the model's name."""
    params = {k: v for k, v in case.params.items() if k != "model"}
    return json.dumps({"dtype": DTYPE_NAMES.get(case.dtype, str(case.dtype)), "init": task.init_args(case),
                       "params": params}, sort_keys=True, default=str)


def select_cases(task: Task, spec: OpPeers, profile: str, keyword: Optional[str] = None,
                 max_cases: int = 0) -> List[Selected]:
    """The op's cases for the profile, filtered, deduplicated, ``-k``-selected and capped.

    Under a cap, the cases the op's targets judge come first (one of each target in turn), then
    the rest spread over their cost (most expensive, cheapest, midpoints), so a few cases still span
    the range.
    """
    unique: Dict[str, Selected] = {}
    for i, case in enumerate(task.cases(profile)):
        if not spec.case_filter(case):
            continue
        key = shape_key(task, case)
        if key in unique:
            unique[key].same_as.append(case.id)
        else:
            unique[key] = Selected(case, [], i)
    chosen = list(unique.values())
    if keyword:
        from _pytest.mark.expression import Expression  # pytest's own -k grammar

        expr = Expression.compile(keyword)
        chosen = [s for s in chosen
                  if expr.evaluate(_substring_matcher(" ".join([task.name, s.case.id, *s.same_as])))]
    chosen = _priority_order(chosen, spec.targets, lambda s: task.io_bytes(s.case) + task.flops(s.case))
    return chosen[:max_cases] if max_cases else chosen


def _substring_matcher(haystack: str):
    haystack = haystack.lower()
    return lambda name, **_: name.lower() in haystack


def _priority_order(items: List[Selected], targets: Sequence[Target], cost) -> List[Selected]:
    groups = [[s for s in items if t.applies(s.case)] for t in targets]
    judged = {id(s) for g in groups for s in g}
    rest = sorted((s for s in items if id(s) not in judged), key=cost)
    groups = [g for g in groups if g] + [[rest[i] for i in _spread_indices(len(rest))]]
    out, seen = [], set()
    while any(groups):
        for g in groups:
            while g and id(g[0]) in seen:
                g.pop(0)
            if g:
                seen.add(id(g[0]))
                out.append(g.pop(0))
    return out


def _spread_indices(n: int) -> List[int]:
    """n-1, 0, then midpoints breadth-first: any prefix spans the range, the most expensive first."""
    if n <= 2:
        return list(range(n))[::-1]
    out, queue = [n - 1, 0], [(0, n - 1)]
    while queue:
        a, b = queue.pop(0)
        m = (a + b) // 2
        if a < m < b:
            out.append(m)
            queue += [(a, m), (m, b)]
    return out
