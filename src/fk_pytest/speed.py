"""Speed of one case: build both modules on shared weights, time them side by side, derive rates."""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional

import torch

from . import status
from .build import clone_inputs, draw_inputs, instantiate, instantiate_candidate, master_state, upcast_inputs
from .compare import output_error, reference_error
from .ref_cache import pack_rows, unpack_rows
from .correctness import as_outputs
from .errors import CandidateError, short_traceback
from .guards import tampered
from .phases import phase
from .signatures import remove_call_checks
from .task import Case, Task
from .timing import L2Flusher, Timing, make_runners, time_pair_cpu, time_pair_cuda

SUSPECT_FRACTION = 0.85  # a time under 85% of the roofline floor is not a record but a suspect
# The default timing stops once the speedup's 95% confidence interval is within +-1% (after at least
# QUICK_MIN_ROUNDS rounds, at most the rounds the thorough mode runs); --fk-thorough runs the
# fixed rounds of the 0.5 s budget (at least 50, at most 500), whatever the interval.
TARGET_CI = 0.01
QUICK_MIN_ROUNDS = 50  # 20 let one decode-sized identity check end 3.3% off with a "1%" interval (H200)
QUICK_MIN_SECONDS = 2.0  # rounds of calls this slow need fewer than QUICK_MIN_ROUNDS (timing.min_rounds_for)
# Input sets the one-call replays rotate over on CUDA. Every timed window opens after an L2 flush,
# which already leaves the set cold, so the default keeps one (one warm-up and one capture per
# implementation); --fk-thorough keeps the four rotated sets of the method until 2026-12-06. The
# K-call graph of amortised timing draws its own sets in both modes (call j on set j).
ROTATED_SETS = 1
THOROUGH_ROTATED_SETS = 4


@dataclasses.dataclass
class SpeedResult:
    case_id: str
    weight: float
    cand_us: float
    ref_us: float
    speedup: float
    cand_spread: float
    ref_spread: float
    rounds: int
    mode: str
    informational: bool  # CPU timings never enter MacroEval
    bytes: int
    flops: int
    tbps: Optional[float] = None
    tflops: Optional[float] = None
    roofline_floor_us: Optional[float] = None
    frac_roofline: Optional[float] = None
    suspect: bool = False
    note: str = ""
    samples_us: Optional[list] = None
    calls: int = 1  # calls per timed replay (amortised timing; 1: one call per replay)
    cand_single_us: Optional[float] = None  # one call per replay (the launch floor included)
    ref_single_us: Optional[float] = None
    phases: Dict[str, float] = dataclasses.field(default_factory=dict)  # seconds per phase (fk_pytest.phases)
    ratio_ci: Optional[float] = None  # the speedup's 95% CI half-width, relative (default timing)
    reference: str = "run"  # the reference's timing: measured beside the candidate ("run") or "cache"
    ref_suspect: bool = False  # the reference's time is under the roofline floor: the case is not scored
    remeasured: bool = False  # a first timing under the roofline floor was timed again

    def as_json(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("samples_us")
        return d


def measure_speed(task: Task, case: Case, candidate_cls: type, device, seed: int,
                  roofline: Optional[Dict[str, float]] = None, flusher: Optional[L2Flusher] = None,
                  input_sets: Optional[int] = None, compose=None, thorough: bool = False, cache=None) -> SpeedResult:
    if input_sets is None:
        input_sets = THOROUGH_ROTATED_SETS if thorough else ROTATED_SETS
    try:
        return _measure(task, case, candidate_cls, torch.device(device), seed, roofline, flusher,
                        input_sets, compose, thorough, cache)
    except NotImplementedError as exc:  # a path the candidate has not written: not a crash
        raise CandidateError(status.NOT_IMPLEMENTED,
                             f"candidate raised {short_traceback(exc)} while being timed") from exc


def _measure(task, case, candidate_cls, device, seed, roofline, flusher, input_sets, compose,
             thorough, cache) -> SpeedResult:
    rounds = {} if thorough else {"target_ci": TARGET_CI, "min_rounds": QUICK_MIN_ROUNDS,
                                 "min_seconds": QUICK_MIN_SECONDS}
    key = cached = None
    if cache is not None and timings_cacheable(device):
        from .ref_cache import case_key
        key = case_key(task, case, seed, "speed", device, timing={"thorough": thorough, **rounds,
                                                                  "input_sets": input_sets})
        cached = cache.load(key)
    with phase("build", device):
        state = master_state(task, case, seed, device)
        reference = None if cached else instantiate(task.reference, task, case, state, device, case.dtype)
        candidate = instantiate_candidate(candidate_cls, task, case, state, device, case.dtype, compose)
        if reference is not None and case.dtype == torch.float32:
            # The master weights are float32 too: the reference holds the same values, so the
            # timed check's truth is built from those and the master copy goes (a float32 4-layer
            # cut of Qwen3-Next is 26 GB a copy: master, two modules and a float64 truth ran the
            # H200 out of memory on 2026-12-04).
            state = reference.state_dict()
    with phase("inputs", device):
        # The CPU times each of two sets once and checks both calls' outputs (no graph to replay).
        sets = draw_inputs(task, case, device, range(seed, seed + (input_sets if device.type == "cuda" else 2)))
    with phase("capture", device):  # graph capture (the warm-up calls before it bill "warm_up")
        runners = make_runners(candidate, reference, sets, device, task.call)
    with phase("timing", device):
        if device.type == "cuda":
            remove_call_checks(candidate)  # calls were checked while warming up and capturing: no hook when timed
            more = seed + max(input_sets, 2)  # the amortised timing's extra sets: after the rotated and check sets

            def time_both():
                return time_pair_cuda(runners, flusher or L2Flusher(device), l2_hot=task.l2_hot(case),
                                      more_sets=lambda n: draw_inputs(task, case, device, range(more, more + n)),
                                      calls=cached["timing"]["calls"] if cached else None, **rounds)
            timings = time_both()
            remeasured = bool(under_roofline(task, case, timings, roofline))
            if remeasured:  # a transient (clocks, a neighbour's L2 traffic) or the real thing: once more
                timings = time_both()
        else:
            timings, remeasured = time_pair_cpu(runners), False
    with phase("timed_check", device):
        # The timed path runs once more on values it was never warmed, captured or timed on: the
        # draw of seed + 1 (set 1 where the sets rotate, else drawn now).
        check = sets[1] if len(sets) > 1 else draw_inputs(task, case, device, [seed + 1])[0]
        checks = _check_after_timing(task, case, state, runners, sets, check, device,
                                     cached["checks"] if cached else None)
    if cached:
        cache.hit()
        ref = Timing(**cached["timing"])
        cand = timings["candidate"]
        if cand.median_ci is not None and ref.median_ci is not None:
            cand.ratio_ci = (cand.median_ci ** 2 + ref.median_ci ** 2) ** 0.5
    else:
        ref = timings["reference"]
        if key is not None:
            stored = {f: getattr(ref, f) for f in ("median_us", "spread", "rounds", "mode", "note", "calls",
                                                   "single_us", "single_spread", "median_ci")}
            cache.store(key, {"timing": {**stored, "samples_us": []}, "checks": checks})
    result = _result(task, case, timings["candidate"], ref, roofline)
    result.reference, result.remeasured = ("cache" if cached else "run"), remeasured
    if result.ref_suspect:
        result.note = "; ".join(n for n in (result.note, (
            f"the reference's {result.ref_us:.2f} us is under the roofline floor {result.roofline_floor_us:.2f} us "
            "(its inputs in L2, or a wrong byte count): the case is not scored")) if n)
    return result


def roofline_floor_s(task, case, roofline) -> float:
    """The fewest seconds the case can take on this GPU: its bytes at the measured copy bandwidth
    or its FLOPs at the measured bf16 GEMM rate, whichever is longer (0: nothing to bound by)."""
    if not roofline:
        return 0.0
    return max(int(task.io_bytes(case)) / (roofline["copy_tbps"] * 1e12),
               int(task.flops(case)) / (roofline["bf16_gemm_tflops"] * 1e12))


def under_roofline(task, case, timings, roofline) -> List[str]:
    """The implementations whose measured time is under SUSPECT_FRACTION of the case's roofline floor."""
    floor_s = roofline_floor_s(task, case, roofline)
    return [name for name, t in timings.items() if floor_s > 0 and t.median_us * 1e-6 < SUSPECT_FRACTION * floor_s]



def timings_cacheable(device) -> bool:
    """GPU timings only: a CPU timing is the interpreter's wall time, informational and one round."""
    return device.type == "cuda"


def _check_after_timing(task, case, state, runners, sets, values, device, ref_checks=None) -> dict:
    """The path that was timed must compute the op, and the timers must be the genuine ones.

    Set 0's buffers receive ``values`` (an input set they never held) and the timed
    path (graph replay or eager launch) runs once more; its outputs must pass a sanity check
    against the truth for ``values``. On the CPU, where
    there is no captured graph and a call-counting candidate could behave only while checked, the
    outputs of the timed calls themselves are checked as well. A candidate that computes only when
    it is checked, replays a cached result or leaves its work on another stream fails here.

    The bar is the reference's error on the same inputs: measured here, or ``ref_checks`` (the
    reference cache's, with no reference runner). Returns the reference's errors it used.
    """
    names = tampered()
    if names:
        raise CandidateError(status.TAMPERED, f"candidate code replaced {', '.join(names[:5])}")
    # The rule for undetermined rows watches the reference's router logits: the timed reference
    # module serves (without it the rule builds its own copy at the case dtype, a third model in
    # memory: a float32 Qwen3-Next cut ran the H200 out of memory that way on 2026-12-05).
    ref_module = getattr(runners.get("reference"), "module", None)
    with torch.no_grad():
        truth_module = instantiate(task.reference, task, case, state, device, torch.float64)

        def truths_for(values, known_rows=None):
            """The truths, each paired with its rows left out (``Task.undetermined_rows``, or
            ``known_rows`` from the reference cache; None: all)."""
            upcast = upcast_inputs(values)
            observed = task.undetermined_rows(case, upcast, truth_module, ref_module) if known_rows is None else None
            if observed is not None and ref_module is not None:
                task.call(ref_module, clone_inputs(values))  # the rule records its logits
            truths = as_outputs(task.call(truth_module, upcast, "forward_native"), task.output_names(case), "truth")
            masks = observed() if observed is not None else {}
            if known_rows is not None:
                masks = {n: unpack_rows(m).to(device) for n, m in known_rows.items()}
            return [(t, masks.get(n)) for n, t in zip(task.output_names(case), truths)]

        by_set = {}  # set index -> its truths: the float64 model runs once per input set
        for (i, cand_out), (_, ref_out) in zip(getattr(runners["candidate"], "timed_outputs", []),
                                               getattr(runners.get("reference"), "timed_outputs", [])):
            if i % len(sets) not in by_set:
                by_set[i % len(sets)] = truths_for(sets[i % len(sets)])
            truths = by_set[i % len(sets)]
            _sane(task, case, truths, _errors(truths, ref_out), cand_out, "a timed call")
        known = (ref_checks or {}).get("rows")
        # The CPU's set 1 is ``values``: its truth may be computed already.
        truths = by_set.get(1) if known is None and len(sets) > 1 and sets[1] is values else None
        if truths is None:
            truths = truths_for(values, known)
    checks = dict(ref_checks or {})
    checks.setdefault("rows", {n: pack_rows(m) for n, (_, m) in zip(task.output_names(case), truths)
                               if m is not None})
    if "single" not in checks:
        checks["single"] = _errors(truths, runners["reference"].verify(0, values))
    cand_out = runners["candidate"].verify(0, values)
    _sane(task, case, truths, checks["single"], cand_out, "the timed path, run again on fresh inputs,")
    if getattr(runners["candidate"], "calls", 1) > 1:  # the K-call replay is timed too: check it
        if "many" not in checks:
            checks["many"] = _errors(truths, runners["reference"].verify(0, values, many=True))
        cand_out = runners["candidate"].verify(0, values, many=True)
        _sane(task, case, truths, checks["many"], cand_out, "the amortised (K-call) timed path on fresh inputs")
    return checks


def _errors(truths, outs) -> list:
    """The reference's (L2, element) errors per output on the rows the truth determines."""
    errors = []
    for (t, left_out), r in zip(truths, outs):
        if left_out is not None and not bool(left_out.all()):
            t, r = (x[~left_out.to(x.device)] for x in (t, r))
        errors.append(list(reference_error(t, r)))
    return errors


def _sane(task, case, truths, ref_errors, cand_out, what: str) -> None:
    """A sanity bound on what was timed, not the verdict (that is the correctness tests'):
    finite where the truth is, and within twice the task's limit (the bar: the reference's
    ``ref_errors`` on the same inputs, see :func:`_errors`)."""
    if len(cand_out) != len(truths) or any(c.shape != t.shape for c, (t, _) in zip(cand_out, truths)):
        raise CandidateError(status.TIMED_OUTPUT_WRONG, f"{what} returned outputs of another structure")
    for name, (t, left_out), err, c in zip(task.output_names(case), truths, ref_errors, cand_out):
        finite = bool(torch.isfinite(c).all()) or not bool(torch.isfinite(t).all())
        if left_out is not None and not bool(left_out.all()):  # routing-aware: as the correctness check
            t, c = (x[~left_out.to(x.device)] for x in (t, c))
        if not finite or not output_error(name, t, [], c, case.dtype, truncating=True,
                                          ref_errors=tuple(err)).passed(task.limit * 2):
            raise CandidateError(
                status.TIMED_OUTPUT_WRONG,
                f"output {name!r} of {what} is wrong: the code that was timed does not compute the op "
                "(cached/replayed result, work on another stream, or a different path when timed)")


def _result(task: Task, case: Case, cand: Timing, ref: Timing, roofline) -> SpeedResult:
    nbytes, flops = int(task.io_bytes(case)), int(task.flops(case))
    res = SpeedResult(
        case_id=case.id, weight=case.weight, cand_us=cand.median_us, ref_us=ref.median_us,
        speedup=ref.median_us / cand.median_us if cand.median_us > 0 else float("inf"),
        cand_spread=cand.spread, ref_spread=ref.spread, rounds=cand.rounds,
        mode=(cand.mode if cand.mode == ref.mode else f"candidate {cand.mode}, reference {ref.mode}")
        + (f" x{cand.calls}" if cand.calls > 1 else ""),
        informational=cand.mode == "cpu-wall", bytes=nbytes, flops=flops,
        note="; ".join(n for n in (cand.note, ref.note) if n), samples_us=cand.samples_us,
        calls=cand.calls, cand_single_us=cand.single_us, ref_single_us=ref.single_us, ratio_ci=cand.ratio_ci)
    seconds = cand.median_us * 1e-6
    if seconds > 0:
        res.tbps = nbytes / seconds / 1e12 if nbytes else None
        res.tflops = flops / seconds / 1e12 if flops else None
    if roofline and not res.informational:
        floor_s = roofline_floor_s(task, case, roofline)
        if floor_s > 0:
            res.roofline_floor_us = floor_s * 1e6
            res.frac_roofline = floor_s / seconds
            res.suspect = seconds < SUSPECT_FRACTION * floor_s
            res.ref_suspect = ref.median_us * 1e-6 < SUSPECT_FRACTION * floor_s
    return res
