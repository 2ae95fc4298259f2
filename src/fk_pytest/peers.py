"""The peer benchmark: the reference against the kernels a user could pick instead, timed the suite's way.

    fk-peers --device cuda --profile full --ops rms_norm,attention --json peers.json --md peers.md

For every op (an L1 task) and each selected workload case:

1. build the reference on the case's weights and inputs with the suite's own helpers, so every
   implementation sees exactly the task's inputs (strided views, paged caches, metadata);
2. build each peer the suite names for the op (``<suite>.peers.OPS``: torch eager, torch.compile,
   Liger-Kernel, SDPA backends, flex_attention, ...); a peer that cannot run the case is recorded
   as ``unsupported`` or ``skipped`` with the reason;
3. check every peer's outputs (and the inputs it must write, e.g. the KV cache) against the float64
   truth with the task's calibrated compare; a ``wrong`` peer is reported and never "best";
4. time the reference and the surviving peers interleaved in one loop with :mod:`fk_pytest.timing`
   (CUDA-graph replay where capturable, L2 flush outside the timed window, rotated inputs);
5. derive TB/s, TFLOP/s, the fraction of the roofline measured at start, the best peer and
   ``ratio = best peer time / reference time`` (above 1: the reference is faster).

Per op: geomean and minimum of the ratio over the cases, and the op's bandwidth targets for the
reference, each said to hold or not. Cases run round-robin over the ops (target cases first), so a
``--time-budget`` cut still leaves every op measured. Output: JSON (``SCHEMA``) and markdown; the
JSON is rewritten after every case (``"complete": false`` until the end).
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib
import json
import math
import sys
import time
import zlib
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .build import clone_inputs, instantiate, master_state, upcast_inputs
from .compare import ELEMENT_LIMIT_FACTOR, output_error, triton_interpreter_active
from .correctness import as_outputs
from .errors import CandidateError
from .registry import _suite_package, all_tasks
from .report import environment, write_json
from .task import DTYPE_NAMES, Case, Task
# The runners are the suite's own timing method; the peer benchmark drives N of them instead of two.
from .timing import L2Flusher, Timing, _CpuRunner, _GpuRunner, measure_roofline, time_pair_cpu, time_pair_cuda

SCHEMA = "fastkernels.peers/1"
REFERENCE = "reference"
# Done-when of the peer benchmark (per op): the reference is at least as fast as the best peer on
# geomean over the shapes, and no single shape is more than 10% slower.
RATIO_GEOMEAN_TARGET = 1.0
RATIO_SHAPE_FLOOR = 0.9
# The timing method's noise: the reference timed against an identical copy of itself lands within
# +-3% (docs/perf/h200-l1.md). A miss by less is said to be within noise; the target stays strict.
TIMING_NOISE = 0.03


# ---- what the suite declares per op ------------------------------------------------------------
class PeerNotRun(Exception):
    """A peer that does not run on this case; ``status`` says why in one word."""

    status = "unsupported"


class Unsupported(PeerNotRun):
    """The implementation cannot compute this case (a backend without GQA, a style it lacks)."""

    status = "unsupported"


class Skipped(PeerNotRun):
    """Not run by choice or circumstance (library absent, --no-compile, no GPU)."""

    status = "skipped"


@dataclasses.dataclass
class PeerContext:
    """What a peer's ``build`` gets: the case, the reference instance (weights to share) and options."""

    task: Task
    case: Case
    reference: torch.nn.Module
    state: Dict[str, torch.Tensor]
    device: torch.device
    compile: bool
    notes: List[str] = dataclasses.field(default_factory=list)

    def new_reference(self) -> torch.nn.Module:
        """A second reference instance on the same weights (for peers that patch the module)."""
        return instantiate(self.task.reference, self.task, self.case, self.state, self.device, self.case.dtype)

    def note(self, text: str) -> None:
        self.notes.append(text)


@dataclasses.dataclass(frozen=True)
class Peer:
    """An implementation a user could pick. ``build(ctx)`` returns ``fn(inputs) -> outputs`` in the
    task's output convention (inputs the task writes in place are read back after the call), or
    raises :class:`Unsupported` / :class:`Skipped`."""

    name: str
    description: str
    build: Callable[[PeerContext], Callable[[Dict[str, Any]], Any]]


@dataclasses.dataclass(frozen=True)
class Target:
    """The reference must reach ``min_bw_frac`` of the measured copy bandwidth on the cases it applies to."""

    name: str
    min_bw_frac: float
    applies: Callable[[Case], bool]


@dataclasses.dataclass(frozen=True)
class OpPeers:
    peers: Tuple[Peer, ...]
    targets: Tuple[Target, ...] = ()
    case_filter: Callable[[Case], bool] = lambda case: True


def suite_peers_module():
    """The suite's peer definitions: ``tasks/peers.py``, installed as ``fk_tasks.peers``."""
    return importlib.import_module(_suite_package().__name__ + ".peers")


def suite_ops() -> Dict[str, OpPeers]:
    return suite_peers_module().OPS


# ---- the two peers every op has ----------------------------------------------------------------
def _native(ctx: PeerContext):
    module, task = ctx.reference, ctx.task
    return lambda inputs: task.call(module, inputs, "forward_native")


def compiled_native(ctx: PeerContext):
    """Inductor on the reference's plain-PyTorch semantics, one graph per shape (dynamic=False), the
    way a serving engine compiles per captured batch size."""
    if not ctx.compile:
        raise Skipped("torch.compile disabled (--no-compile)")
    module = ctx.new_reference()
    # An instance attribute shadows the method, so task.call (which binds caches and the forward
    # context for attention) runs the compiled function.
    module.forward_native = torch.compile(module.forward_native, dynamic=False)
    return lambda inputs: ctx.task.call(module, inputs, "forward_native")


EAGER = Peer("eager", "the reference's forward_native in eager PyTorch (what a user writes)", _native)
COMPILE = Peer("compile", "torch.compile(forward_native, dynamic=False): Inductor", compiled_native)


# ---- which cases ---------------------------------------------------------------------------------
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


# ---- one case: build, check, time ----------------------------------------------------------------
@dataclasses.dataclass
class Options:
    device: torch.device
    profile: str
    compile: bool = True
    case_budget_s: float = 0.5  # the timing loop's budget per case (all implementations together)
    input_sets: int = 4
    seed: int = 0
    cpu_rounds: int = 3


def _seed(case: Case, seed: int) -> int:
    return zlib.crc32(f"{case.id}/peers/{seed}".encode()) & 0x7FFFFFFF


def _run(task: Task, case: Case, fn, inputs: Dict[str, Any], who: str) -> List[torch.Tensor]:
    """Outputs of one call: the returned tensors, then the inputs the task writes in place."""
    outs = as_outputs(fn(inputs), task.output_names(case), who)
    return [o.detach() for o in outs] + [inputs[n] for n in task.inplace_outputs(case)]


def check_outputs(task: Task, case: Case, truth, ref_outs, outs) -> Tuple[bool, float, str]:
    """(passed, worst calibrated ratio, message): the task's own bar, as a candidate would face."""
    names = list(task.output_names(case)) + list(task.inplace_outputs(case))
    worst = 0.0
    for name, t, r, o in zip(names, truth, ref_outs, outs):
        if o.shape != r.shape or o.dtype != r.dtype:
            return False, math.inf, f"{name}: {tuple(o.shape)} {o.dtype}, expected {tuple(r.shape)} {r.dtype}"
        if bool(torch.isfinite(t).all()) and not bool(torch.isfinite(o).all()):
            return False, math.inf, f"{name}: NaN/Inf where the truth is finite"
        err = output_error(name, t, [r], o, case.dtype, truncating=triton_interpreter_active())
        worst = max(worst, err.ratio, err.elem_ratio / ELEMENT_LIMIT_FACTOR)
        if not err.passed(task.limit):
            return False, worst, (f"{name}: error {err.e_cand:.3g} vs reference {err.e_ref:.3g} "
                                  f"(ratio {err.ratio:.2f}, per-element {err.elem_ratio:.2f}; limit {task.limit})")
    return True, worst, ""


def _truth(task: Task, case: Case, state, inputs, device) -> List[torch.Tensor]:
    """The reference semantics in float64 (forward_native on upcast weights and inputs)."""
    module = instantiate(task.reference, task, case, state, device, torch.float64)
    return _run(task, case, lambda s: task.call(module, s, "forward_native"),
                upcast_inputs(clone_inputs(inputs)), "truth")


def _short(exc: BaseException) -> str:
    text = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text[:400]}"


def measure_case(task: Task, case: Case, peers: Sequence[Peer], opts: Options,
                 roofline: Optional[Dict[str, float]] = None, flusher=None) -> Dict[str, Any]:
    """Check and time the reference and every peer on one case; returns the case's record."""
    device, seed = opts.device, _seed(case, opts.seed)
    state = master_state(task, case, seed, device)
    reference = instantiate(task.reference, task, case, state, device, case.dtype)
    n_sets = opts.input_sets if device.type == "cuda" else 2
    sets = [task.make_inputs(case, torch.Generator(device=device).manual_seed(seed + i), device)
            for i in range(n_sets)]
    truth = _truth(task, case, state, sets[0], device)
    ref_fn = lambda s: task.call(reference, s)  # noqa: E731
    ref_outs = _run(task, case, ref_fn, clone_inputs(sets[0]), "the reference")

    impls: Dict[str, Dict[str, Any]] = {}
    timed: Dict[str, Callable] = {REFERENCE: ref_fn}
    for peer in peers:
        ctx = PeerContext(task, case, reference, state, device, opts.compile)
        try:
            fn = peer.build(ctx)
            outs = _run(task, case, fn, clone_inputs(sets[0]), f"peer {peer.name}")
        except PeerNotRun as exc:
            impls[peer.name] = {"status": exc.status, "reason": str(exc)}
            continue
        except CandidateError as exc:  # outputs of the wrong structure
            impls[peer.name] = {"status": "wrong", "reason": exc.message}
            continue
        except Exception as exc:
            impls[peer.name] = {"status": "error", "reason": _short(exc)}
            continue
        passed, worst, message = check_outputs(task, case, truth, ref_outs, outs)
        impls[peer.name] = {"status": "ok" if passed else "wrong", "error_ratio": worst,
                            "note": "; ".join(ctx.notes)}
        if passed:
            timed[peer.name] = fn
        else:
            impls[peer.name]["reason"] = message
    del truth, ref_outs

    timings, failed = _time(timed, sets, opts, flusher)
    nbytes, flops = int(task.io_bytes(case)), int(task.flops(case))
    impls[REFERENCE] = {"status": "ok"}
    for name, reason in failed.items():
        impls[name].update(status="error", reason=reason)
    for name, timing in timings.items():
        impls[name].update(rates(timing, nbytes, flops, roofline))
    record = {"case": case.id, "same_as": [], "model": case.model, "dtype": DTYPE_NAMES.get(case.dtype),
              "params": dict(case.params), "weight": case.weight, "bytes": nbytes, "flops": flops,
              "impls": {REFERENCE: impls.pop(REFERENCE), **impls}}
    record.update(case_verdict(record["impls"]))
    return record


def _time(timed: Dict[str, Callable], sets, opts: Options, flusher) -> Tuple[Dict[str, Timing], Dict[str, str]]:
    """Time every implementation interleaved in one loop; returns timings and per-name failures."""
    call = lambda fn, inputs: fn(inputs)  # noqa: E731  (runners call ``call(module, inputs)``)
    runners, failed = {}, {}
    for name, fn in timed.items():
        try:
            if opts.device.type == "cuda":
                runners[name] = _GpuRunner(fn, sets, True, call)
            else:
                runners[name] = _CpuRunner(fn, sets, call)
        except Exception as exc:  # warm-up failed (e.g. a backend that runs once but not twice)
            failed[name] = f"could not be timed: {_short(exc)}"
    if not runners:
        return {}, failed
    try:
        if opts.device.type == "cuda":
            return time_pair_cuda(runners, flusher or L2Flusher(opts.device), budget_s=opts.case_budget_s), failed
        return time_pair_cpu(runners, rounds=opts.cpu_rounds), failed
    except Exception as exc:
        return {}, {**failed, **{name: f"timing loop failed: {_short(exc)}" for name in runners}}


def rates(timing: Timing, nbytes: int, flops: int, roofline: Optional[Dict[str, float]]) -> Dict[str, Any]:
    seconds = timing.median_us * 1e-6
    out = {"us": timing.median_us, "spread": timing.spread, "rounds": timing.rounds, "mode": timing.mode,
           "tbps": None, "tflops": None, "roofline_frac": None, "bw_frac": None}
    if timing.note:
        out["timing_note"] = timing.note
    if seconds > 0:
        out["tbps"] = nbytes / seconds / 1e12 if nbytes else None
        out["tflops"] = flops / seconds / 1e12 if flops else None
    if roofline and seconds > 0:
        floor_s = max(nbytes / (roofline["copy_tbps"] * 1e12), flops / (roofline["bf16_gemm_tflops"] * 1e12))
        out["roofline_frac"] = floor_s / seconds if floor_s > 0 else None
        out["bw_frac"] = out["tbps"] / roofline["copy_tbps"] if out["tbps"] else None
    return out


# ---- verdicts ------------------------------------------------------------------------------------
def case_verdict(impls: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """Best peer = the fastest peer that ran correctly; ratio = its time / the reference's time."""
    timed = {n: r for n, r in impls.items() if n != REFERENCE and r.get("status") == "ok" and r.get("us")}
    ref = impls.get(REFERENCE, {})
    if not timed:
        return {"best_peer": None, "best_peer_us": None, "ratio": None}
    best = min(timed, key=lambda n: timed[n]["us"])
    ratio = timed[best]["us"] / ref["us"] if ref.get("status") == "ok" and ref.get("us") else None
    return {"best_peer": best, "best_peer_us": timed[best]["us"], "ratio": ratio}


def geomean(xs: Sequence[float]) -> Optional[float]:
    xs = [x for x in xs if x is not None and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def op_summary(cases: Sequence[Dict[str, Any]], targets: Sequence[Target], case_of: Dict[str, Case],
               informational: bool) -> Dict[str, Any]:
    """Ratio target and bandwidth targets of one op, each ``held`` True/False (None: nothing to judge)."""
    ratios = [(c["ratio"], c["case"]) for c in cases if c.get("ratio") is not None]
    geo = geomean([r for r, _ in ratios])
    low = min(ratios, default=(None, None))
    ratio_held = None if not ratios else bool(geo >= RATIO_GEOMEAN_TARGET and low[0] >= RATIO_SHAPE_FLOOR)
    within_noise = None if not ratios else bool(geo >= RATIO_GEOMEAN_TARGET * (1 - TIMING_NOISE)
                                                and low[0] >= RATIO_SHAPE_FLOOR * (1 - TIMING_NOISE))
    judged = []
    for target in targets:
        values = [(c["impls"][REFERENCE].get("bw_frac"), c["case"]) for c in cases
                  if c["case"] in case_of and target.applies(case_of[c["case"]])]
        measured = [(v, cid) for v, cid in values if v is not None]
        worst = min(measured, default=(None, None))
        held = bool(worst[0] >= target.min_bw_frac) if measured and len(measured) == len(values) else None
        note = ("no case of this run applies" if not values else
                "no roofline (timings are informational)" if not measured else "")
        judged.append({"name": target.name, "min_bw_frac": target.min_bw_frac, "cases": len(values),
                       "worst_bw_frac": worst[0], "worst_case": worst[1], "held": held, "note": note})
    checks = [ratio_held] + [t["held"] for t in judged]
    return {"cases_with_ratio": len(ratios), "geomean_ratio": geo, "min_ratio": low[0], "min_ratio_case": low[1],
            "ratio_target": {"geomean_min": RATIO_GEOMEAN_TARGET, "shape_min": RATIO_SHAPE_FLOOR, "held": ratio_held,
                             "within_noise": within_noise, "noise": TIMING_NOISE},
            "targets": judged, "informational": informational,
            "all_held": None if any(c is None for c in checks) else all(checks)}


# ---- the run -------------------------------------------------------------------------------------
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
                         "peers": [{"name": p.name, "description": p.description} for p in spec.peers],
                         "targets": [{"name": t.name, "min_bw_frac": t.min_bw_frac} for t in spec.targets],
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
                rec = measure_case(task, sel.case, spec.peers, opts, roofline, flusher)
            except Exception as exc:  # the reference itself failed on this case: say so, go on
                rec = {"case": sel.case.id, "params": dict(sel.case.params), "error": _short(exc),
                       "impls": {REFERENCE: {"status": "error", "reason": _short(exc)}},
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
        entry["summary"] = op_summary(entry["cases"], ops[name].targets, case_of, informational)
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


# ---- text ----------------------------------------------------------------------------------------
def _f(x, spec=".2f", none="-"):
    return none if x is None else format(x, spec)


def progress_line(op: str, rec: Dict[str, Any]) -> str:
    cells = []
    for name, r in rec["impls"].items():
        cells.append(f"{name} {r['us']:.2f}us" if r.get("us") is not None else f"{name} {r.get('status')}")
    tail = f" -> best {rec['best_peer']} ratio {rec['ratio']:.3f}" if rec.get("ratio") is not None else ""
    return f"{op} {rec['case']}: " + " | ".join(cells) + tail


def _held(h) -> str:
    return "n/a" if h is None else ("held" if h else "MISSED")


def _target_text(t: Dict[str, Any]) -> str:
    if t["held"] is None:
        return f"{t['name']}: n/a ({t['note']})"
    return (f"{t['name']}: {_held(t['held'])} (worst {t['worst_bw_frac']:.2f} at {t['worst_case']}, "
            f"{t['cases']} case{'s' if t['cases'] != 1 else ''})")


def summary_rows(doc: Dict[str, Any]) -> List[Tuple[str, ...]]:
    rows = []
    for op in doc["ops"]:
        s = op["summary"]
        low = f"{s['min_ratio']:.3f} ({s['min_ratio_case']})" if s["min_ratio"] is not None else "-"
        targets = "; ".join(_target_text(t) for t in s["targets"]) or "-"
        ratio = s["ratio_target"]
        verdict = _held(ratio["held"])
        if ratio["held"] is False and ratio.get("within_noise"):
            verdict += f" (within the +-{ratio['noise']:.0%} timing noise)"
        rows.append((op["op"], str(len(op["cases"])), _f(s["geomean_ratio"], ".3f"), low, verdict, targets))
    return rows


def format_summary(doc: Dict[str, Any]) -> str:
    head = ("op", "cases", "geomean ratio", "min ratio (case)", "ratio target", "bandwidth targets (reference)")
    rows = [head] + summary_rows(doc)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows]
    lines.insert(1, "-" * min(160, len(lines[0])))
    note = "" if doc["run"]["device"] == "cuda" else "\n(timings on the CPU are informational only)"
    return "\n".join(lines) + "\nratio = best peer time / reference time (above 1: the reference is faster)" + note


def to_markdown(doc: Dict[str, Any], command: Optional[str] = None) -> str:
    env, run = doc["environment"], doc["run"]
    roof = env.get("roofline") or {}
    lines = ["# Peer benchmark: the reference against the kernels a user could pick", ""]
    machine = env.get("gpu") or env.get("platform")
    versions = (f"torch {env.get('torch')}, triton {env.get('triton')}, "
                f"liger-kernel {env.get('liger_kernel') or 'absent'}")
    lines.append(f"{machine}, {versions}" + (f"; measured at start: copy {roof['copy_tbps']:.2f} TB/s, "
                                             f"bf16 GEMM {roof['bf16_gemm_tflops']:.0f} TFLOP/s" if roof else "") + ".")
    lines.append("")
    if command:
        lines += ["Command (repo root):", "", f"    {command}", ""]
    lines += [f"Profile `{run['profile']}`, up to {run['max_cases_per_op'] or 'all'} cases per op"
              f"{', selection `-k ' + run['keyword'] + '`' if run.get('keyword') else ''}, "
              f"{run.get('elapsed_s', '?')} s{'' if doc['complete'] else ' (INCOMPLETE run)'}. "
              "Each case: every peer checked against the float64 truth with the task's calibrated compare "
              "(a wrong peer is excluded), then all implementations timed interleaved in one loop "
              "(CUDA-graph replay where capturable, L2 flushed outside the timed window, rotated inputs). "
              f"**ratio = best peer time / reference time**; targets per op: geomean >= {RATIO_GEOMEAN_TARGET}, "
              f"no shape < {RATIO_SHAPE_FLOOR}, and the bandwidth targets (fraction of the measured copy "
              "bandwidth reached by the reference).", ""]
    if run["device"] != "cuda":
        lines += ["Timings on the CPU are informational only.", ""]
    lines += ["## Summary", "", "| op | cases | geomean ratio | min ratio (case) | ratio target | bandwidth targets |",
              "|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(r) + " |" for r in summary_rows(doc)]
    for op in doc["ops"]:
        lines += ["", f"## {op['op']}", "", f"Reference `{op['reference']}`. Peers: " +
                  "; ".join(f"**{p['name']}**: {p['description']}" for p in op["peers"]) + ".", ""]
        lines += _case_table(op)
        if op["not_run"]:
            lines += ["", "Not run: " + ", ".join(f"{n['case']} ({n['reason']})" for n in op["not_run"])]
    return "\n".join(lines) + "\n"


def _case_table(op: Dict[str, Any]) -> List[str]:
    peers = [p["name"] for p in op["peers"]]
    lines = ["| case | mode | reference us | TB/s | TFLOP/s | roofline frac | copy-BW frac | " +
             " | ".join(f"{p} us" for p in peers) + " | best peer | ratio |", "|---" * (9 + len(peers)) + "|"]
    footnotes: Dict[str, int] = {}

    def mark(text: str) -> str:
        return f"[{footnotes.setdefault(text, len(footnotes) + 1)}]"

    for c in op["cases"]:
        ref = c["impls"].get(REFERENCE, {})
        cells = [c["case"] + (f" (= {', '.join(c['same_as'])})" if c.get("same_as") else ""), ref.get("mode", "-")]
        if ref.get("us") is None:
            cells[-1] = f"{ref.get('status', 'absent')} " + mark(f"reference: {ref.get('reason', c.get('error'))}")
        cells += [_f(ref.get("us")), _f(ref.get("tbps")), _f(ref.get("tflops"), ".1f"),
                  _f(ref.get("roofline_frac")), _f(ref.get("bw_frac"))]
        for p in peers:
            r = c["impls"].get(p, {"status": "absent"})
            if r.get("us") is not None:
                cells.append(_f(r["us"]) + (" " + mark(f"{p}: {r['note']}") if r.get("note") else ""))
            else:
                why = f"{p}: {r.get('status')}: {r.get('reason', '')}"
                cells.append(f"{r.get('status')} {mark(why)}")
        cells += [c.get("best_peer") or "-", _f(c.get("ratio"), ".3f")]
        lines.append("| " + " | ".join(cells) + " |")
    if footnotes:
        lines += [""] + [f"[{n}] {text}  " for text, n in footnotes.items()]
    return lines


# ---- command line --------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fk-peers", description=(
        "Time the reference kernels against the peers a user could pick (torch eager, torch.compile, "
        "Liger-Kernel, SDPA backends, flex_attention) on the suite's workload cases."))
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--profile", choices=["cpu", "full"], help="workload profile (default: full on cuda, cpu on cpu)")
    p.add_argument("--ops", help="comma-separated ops (default: every op with peer definitions)")
    p.add_argument("-k", dest="keyword", help="pytest-style expression over 'op case-id', e.g. 'T16384 and not fused'")
    p.add_argument("--max-cases-per-op", type=int, default=4, help="0: all (default 4, target cases first)")
    p.add_argument("--case-budget", type=float, default=0.5, help="seconds of timing loop per case (default 0.5)")
    p.add_argument("--time-budget", type=float, default=None,
                   help="stop starting new cases after this many seconds (default 280 on cuda, none on cpu; 0: none)")
    p.add_argument("--no-compile", action="store_true",
                   help="skip the torch.compile peers (flex_attention then runs uncompiled)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the JSON document here (rewritten after every case)")
    p.add_argument("--md", help="write the markdown tables here")
    p.add_argument("--list", action="store_true", help="print the selected cases and peers, run nothing")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    wants_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if wants_cuda else "cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        print("fk-peers: --device cuda but torch sees no GPU", file=sys.stderr)
        return 2
    profile = args.profile or ("full" if device.type == "cuda" else "cpu")
    budget = args.time_budget if args.time_budget is not None else (280.0 if device.type == "cuda" else 0.0)
    op_names = [o.strip() for o in args.ops.split(",") if o.strip()] if args.ops else None
    ops = suite_ops()
    if args.list:
        return _list(ops, op_names, profile, args.keyword, args.max_cases_per_op)
    opts = Options(device=device, profile=profile, compile=not args.no_compile, case_budget_s=args.case_budget,
                   seed=args.seed)
    command = "fk-peers " + " ".join(sys.argv[1:] if argv is None else argv)
    try:
        doc = benchmark(opts, op_names, args.keyword, args.max_cases_per_op, budget, ops, args.json,
                        run_info={"command": command})
    except KeyError as exc:
        print(f"fk-peers: {exc.args[0]}", file=sys.stderr)
        return 2
    if args.md:
        Path(args.md).parent.mkdir(parents=True, exist_ok=True)
        Path(args.md).write_text(to_markdown(doc, command))
    print(format_summary(doc))
    return 0


def _list(ops, op_names, profile, keyword, max_cases) -> int:
    tasks = all_tasks()
    for name in op_names or list(ops):
        if name not in ops or name not in tasks:
            print(f"fk-peers: no peer definitions for {name}", file=sys.stderr)
            return 2
        spec = ops[name]
        print(f"{name}: peers {', '.join(p.name for p in spec.peers)}")
        for sel in select_cases(tasks[name], spec, profile, keyword, max_cases):
            print(f"  {sel.case.id}" + (f"  (= {', '.join(sel.same_as)})" if sel.same_as else ""))
    return 0


if __name__ == "__main__":
    # Run the imported module's main, not this __main__ copy: the suite's peer definitions raise and
    # check the classes of ``fk_pytest.peers``, which would otherwise be a second, distinct module.
    from fk_pytest.peers import main as _main

    sys.exit(_main())
