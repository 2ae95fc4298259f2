"""One case: build the reference and every peer on the task's inputs, check the peers against the
float64 truth, time all that passed interleaved in one loop, and derive the rates (TB/s, TFLOP/s,
roofline fractions)."""
from __future__ import annotations

import dataclasses
import math
import zlib
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ..build import clone_inputs, draw_inputs, instantiate, master_state, upcast_inputs
from ..compare import ELEMENT_LIMIT_FACTOR, output_error, triton_interpreter_active
from ..correctness import as_outputs
from ..errors import CandidateError
from ..task import DTYPE_NAMES, Case, Task
# The runners are the suite's own timing method; the peer benchmark drives N of them instead of two.
from ..speed import ROTATED_SETS, SUSPECT_FRACTION, roofline_floor_s, under_roofline
from ..timing import L2Flusher, Timing, _CpuRunner, _GpuRunner, time_pair_cpu, time_pair_cuda
from .contract import REFERENCE, Ceiling, Peer, PeerContext, PeerNotRun
from .verdicts import case_verdict

# Ceilings share the timing loop under this prefix, which no peer's name starts with.
CEILING = "ceiling:"


@dataclasses.dataclass
class Options:
    device: torch.device
    profile: str
    compile: bool = True
    case_budget_s: float = 0.5  # the timing loop's budget per case (all implementations together)
    # Rotated input sets per implementation on a GPU: the suite's default (one; the L2 flush before
    # each timed window already leaves a set cold), so a peer is timed as the reference is in a run.
    input_sets: int = ROTATED_SETS
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


def short_error(exc: BaseException) -> str:
    text = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text[:400]}"


def measure_case(task: Task, case: Case, peers: Sequence[Peer], opts: Options,
                 roofline: Optional[Dict[str, float]] = None, flusher=None,
                 ceilings: Sequence[Ceiling] = ()) -> Dict[str, Any]:
    """Check and time the reference and every peer on one case, with the ceilings that apply to it
    timed beside them; returns the case's record."""
    device, seed = opts.device, _seed(case, opts.seed)
    state = master_state(task, case, seed, device)
    reference = instantiate(task.reference, task, case, state, device, case.dtype)
    n_sets = opts.input_sets if device.type == "cuda" else 2
    sets = draw_inputs(task, case, device, range(seed, seed + n_sets))
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
            impls[peer.name] = {"status": "error", "reason": short_error(exc)}
            continue
        passed, worst, message = check_outputs(task, case, truth, ref_outs, outs)
        impls[peer.name] = {"status": "ok" if passed else "wrong", "error_ratio": worst,
                            "note": "; ".join(ctx.notes)}
        if passed:
            timed[peer.name] = fn
        else:
            impls[peer.name]["reason"] = message
    del truth, ref_outs
    reads: Dict[str, Dict[str, Any]] = {}
    for ceiling in ceilings:
        if not ceiling.applies(case):
            continue
        try:
            timed[CEILING + ceiling.name] = ceiling.build(PeerContext(task, case, reference, state, device,
                                                                      opts.compile))
            reads[ceiling.name] = {"status": "ok"}
        except Exception as exc:
            reads[ceiling.name] = {"status": "error", "reason": short_error(exc)}

    more = seed + n_sets  # the amortised timing's extra input sets (fk_pytest.timing)
    time_all = lambda: _time(timed, sets, opts, flusher,  # noqa: E731
                             lambda n: draw_inputs(task, case, device, range(more, more + n)))
    timings, failed = time_all()
    if under_roofline(task, case, timings, roofline):  # faster than the machine can be: timed again once
        timings, failed = time_all()
    suspects = under_roofline(task, case, timings, roofline)
    nbytes, flops = int(task.io_bytes(case)), int(task.flops(case))
    impls[REFERENCE] = {"status": "ok"}
    entry = lambda name: reads[name[len(CEILING):]] if name.startswith(CEILING) else impls[name]  # noqa: E731
    for name, reason in failed.items():
        entry(name).update(status="error", reason=reason)
    for name, timing in timings.items():
        entry(name).update(rates(timing, nbytes, flops, roofline))
    floor_us = roofline_floor_s(task, case, roofline) * 1e6
    for name in suspects:  # a time no GPU could give is not a record: flagged, left out of every ratio
        entry(name).update(status="suspect", reason=f"{timings[name].median_us:.3f} us, timed twice, is under "
                           f"{SUSPECT_FRACTION:.0%} of the case's roofline floor {floor_us:.3f} us",
                           tbps=None, tflops=None, roofline_frac=None, bw_frac=None)
    fastest = min((r["us"] for r in reads.values() if r.get("status") == "ok" and r.get("us")), default=None)
    if fastest and impls[REFERENCE]["status"] == "ok" and impls[REFERENCE].get("us"):  # fastest read / reference
        impls[REFERENCE]["ceiling_frac"] = fastest / impls[REFERENCE]["us"]
    record = {"case": case.id, "same_as": [], "model": case.model, "dtype": DTYPE_NAMES.get(case.dtype),
              "params": dict(case.params), "weight": case.weight, "bytes": nbytes, "flops": flops,
              "impls": {REFERENCE: impls.pop(REFERENCE), **impls}}
    if reads:
        record["ceilings"] = reads
    record.update(case_verdict(record["impls"], {p.name: p.kind for p in peers}))
    return record


def _time(timed: Dict[str, Callable], sets, opts: Options, flusher,
          more_sets=None) -> Tuple[Dict[str, Timing], Dict[str, str]]:
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
            failed[name] = f"could not be timed: {short_error(exc)}"
    if not runners:
        return {}, failed
    try:
        if opts.device.type == "cuda":
            return time_pair_cuda(runners, flusher or L2Flusher(opts.device), budget_s=opts.case_budget_s,
                                  more_sets=more_sets), failed
        return time_pair_cpu(runners, rounds=opts.cpu_rounds), failed
    except Exception as exc:
        return {}, {**failed, **{name: f"timing loop failed: {short_error(exc)}" for name in runners}}


def rates(timing: Timing, nbytes: int, flops: int, roofline: Optional[Dict[str, float]]) -> Dict[str, Any]:
    seconds = timing.median_us * 1e-6
    out = {"us": timing.median_us, "spread": timing.spread, "rounds": timing.rounds, "mode": timing.mode,
           "calls_per_replay": timing.calls, "single_us": timing.single_us,
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
