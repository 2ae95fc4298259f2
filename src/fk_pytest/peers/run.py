"""The run: every selected case of every op, round-robin over the ops (target cases first) so a
``--time-budget`` cut still leaves every op measured; the JSON document is rewritten after every case."""
from __future__ import annotations

import gc
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from ..registry import all_tasks
from ..report import environment, write_json
from ..timing import L2Flusher, measure_roofline
from .contract import REFERENCE, OpPeers, suite_ops
from .measure import Options, measure_case, short_error
from .selection import Selected, select_cases
from .text import progress_line
from .verdicts import RATIO_GEOMEAN_TARGET, RATIO_SHAPE_FLOOR, op_summary

SCHEMA = "fastkernels.peers/1"


def benchmark(opts: Options, op_names: Optional[Sequence[str]] = None, keyword: Optional[str] = None,
              max_cases: int = 4, time_budget_s: float = 0.0, ops: Optional[Dict[str, OpPeers]] = None,
              json_path: Optional[str] = None, run_info: Optional[dict] = None,
              progress=None) -> Dict[str, Any]:
    """Run the peer benchmark; returns the JSON document (also written to ``json_path`` as it grows)."""
    started = time.monotonic()
    progress = progress or sys.stderr
    ops = ops if ops is not None else suite_ops()
    tasks = all_tasks()
    names = list(op_names) if op_names else list(ops)
    unknown = [n for n in names if n not in ops or n not in tasks]
    if unknown:
        known = ", ".join(o for o in ops if o in tasks)
        raise KeyError(f"no peer definitions for {', '.join(unknown)}; known: {known}")

    cuda = opts.device.type == "cuda"
    roofline = measure_roofline(opts.device) if cuda else None
    flusher = L2Flusher(opts.device) if cuda else None
    doc = {"schema": SCHEMA, "complete": False,
           "run": {"device": opts.device.type, "profile": opts.profile, "ops": names, "keyword": keyword,
                   "max_cases_per_op": max_cases, "case_budget_s": opts.case_budget_s,
                   "time_budget_s": time_budget_s, "compile": opts.compile, "seed": opts.seed, **(run_info or {})},
           "environment": _environment(opts.device.type, roofline),
           "targets": {"ratio_geomean_min": RATIO_GEOMEAN_TARGET, "ratio_shape_min": RATIO_SHAPE_FLOOR},
           "ops": []}
    entries, queues = {}, {}
    for name in names:
        task, spec = tasks[name], ops[name]
        selected = select_cases(task, spec, opts.profile, keyword, max_cases)
        queues[name] = selected
        entries[name] = {"op": name, "family": task.family, "level": task.level,
                         "reference": f"{task.reference.__module__}.{task.reference.__qualname__}",
                         "peers": [{"name": p.name, "description": p.description, "kind": p.kind,
                                    "version": p.version_text()} for p in spec.peers],
                         "targets": [{"name": t.name, "min_bw_frac": t.min_bw_frac} for t in spec.targets],
                         "ratio_shape_min": RATIO_SHAPE_FLOOR if spec.shape_floor is None else spec.shape_floor,
                         "production_case_min": spec.production_floor,
                         "cases": [], "not_run": [], "summary": None}
        doc["ops"].append(entries[name])

    records: Dict[str, List[Tuple[int, Dict]]] = {n: [] for n in names}
    order = _round_robin(queues)
    with torch.no_grad():
        for done, (name, sel) in enumerate(order):
            elapsed = time.monotonic() - started
            if time_budget_s and elapsed > time_budget_s:
                entries[name]["not_run"].append({"case": sel.case.id,
                                                 "reason": f"time budget ({time_budget_s:.0f} s) spent"})
                continue
            task, spec = tasks[name], ops[name]
            _reset_compiled_state(opts)
            try:
                rec = measure_case(task, sel.case, spec.peers, opts, roofline, flusher, spec.ceilings)
            except Exception as exc:  # the reference itself failed on this case: say so, go on
                rec = {"case": sel.case.id, "params": dict(sel.case.params), "error": short_error(exc),
                       "impls": {REFERENCE: {"status": "error", "reason": short_error(exc)}},
                       "best_peer": None, "best_peer_us": None, "ratio": None}
            rec["same_as"] = sel.same_as
            records[name].append((sel.order, rec))
            entries[name]["cases"] = [r for _, r in sorted(records[name], key=lambda x: x[0])]
            print(f"[{done + 1}/{len(order)} {time.monotonic() - started:.0f}s] {progress_line(name, rec)}",
                  file=progress, flush=True)
            _free(opts.device)
            if json_path:
                _finish(doc, entries, tasks, ops, started, complete=False)
                write_json(doc, json_path)
    _finish(doc, entries, tasks, ops, started, complete=True)
    if json_path:
        write_json(doc, json_path)
    return doc


def _round_robin(queues: Dict[str, List[Selected]]) -> List[Tuple[str, Selected]]:
    out, depth = [], max((len(q) for q in queues.values()), default=0)
    for i in range(depth):
        out += [(name, q[i]) for name, q in queues.items() if i < len(q)]
    return out


def _finish(doc, entries, tasks, ops, started, complete: bool) -> None:
    informational = doc["run"]["device"] != "cuda"
    for name, entry in entries.items():
        case_of = {c.id: c for c in tasks[name].cases(doc["run"]["profile"])}
        spec = ops[name]
        entry["summary"] = op_summary(entry["cases"], spec.targets, case_of, informational, spec.shape_floor,
                                      spec.production_floor)
    doc["run"]["elapsed_s"] = round(time.monotonic() - started, 1)
    doc["complete"] = complete


def _reset_compiled_state(opts: Options) -> None:
    # One compiled graph per case: without a reset, dynamo's per-function recompile limit would
    # silently fall back to eager after a few shapes.
    if opts.compile:
        torch._dynamo.reset()


def _free(device: torch.device) -> None:
    gc.collect()  # runners, graphs and compiled functions of the finished case
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _environment(device: str, roofline) -> dict:
    env = environment(device, roofline)
    from importlib import metadata

    for dist in ("liger_kernel", "liger-kernel"):
        try:
            env["liger_kernel"] = metadata.version(dist)
            break
        except metadata.PackageNotFoundError:
            env["liger_kernel"] = None
    return env
