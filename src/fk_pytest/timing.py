"""GPU time of candidate and reference, measured side by side.

Method (DESIGN "Speed"): each implementation gets its own copies of the input sets (the caller
decides how many: the flush before every window keeps even one set cold; several rotate, so no
round reuses the previous round's data or output); each call is captured in a CUDA graph when
the module allows it (production runs small kernels inside graphs), else it is launched eagerly.
Every timed round starts with an L2 flush outside the timed window; candidate and reference rounds
alternate in one process, the order flipping each round; all events are read after one final
synchronisation so the host never starves the GPU between rounds. The median is the time, the
interquartile range over the median the spread. On the CPU the same loop uses a host clock and the
result is informational only.

**Amortised timing.** One graph replay costs a few microseconds however little it does (about 4 us
on an H200), which is more than a decode-sized kernel: timed one call per replay, a kernel twice as
fast as the reference would score about 1.0. So each implementation also captures ``K`` calls in
one graph, each call on its own input set (rotated: no call finds its inputs in L2 from the one
before, unless the task declares the case L2-hot), with ``K`` chosen so that a replay lasts at
least ``AMORTISE_TARGET_US``. Each round times a one-call replay and a ``K``-call replay; the
per-call time is their difference over ``K - 1``, the marginal cost of one more call, in which the
replay's fixed cost cancels (the K-call replay over ``K`` would still carry ``fixed / K``). The
one-call replay time is kept beside it (``single_us``). Calls inside one graph still pay the launch
gap between kernels, as they do inside a production decode graph (measured on the H200: about
0.7 us per kernel beyond its CUPTI duration; docs/perf/h200-timing.md).
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import torch

from kernels_reference.cuda_graphs import capture, warm_up

from .build import clone_inputs
from .phases import phase


AMORTISE_TARGET_US = 100.0  # a K-call replay lasts at least this long (the launch floor is ~4 us)
# A GPU busy-wait queued between the L2 flush and each timed window, so that the window's start
# event and launch are enqueued while the GPU is still busy: a window opened on an idle GPU times
# the host's launch latency too. (An H100 peer run of 2026-12-06 timed a 3 us decode kernel's
# one-call replay at 24 us after eager peers that synchronise the host, and its 3-call replay no
# longer than that.) About 20 us at 2 GHz, on top of the flush's own 30-60 us: outside the timed
# window, it costs loop time (counted in the rounds' budget), not accuracy.
LEAD_CYCLES = 40_000
LEAD_S = 2e-5  # what LEAD_CYCLES lasts, for the rounds' budget
# Amortised timing is refused when more than this share of rounds has a K-call replay no longer
# than the one-call replay (a negative or zero marginal cost is a broken measurement, not a fast call).
MAX_NONPOSITIVE_ROUNDS = 0.25
MAX_CALLS_PER_REPLAY = 64
MAX_AMORTISED_BYTES = 1 << 30  # input sets kept for the K calls, per implementation


@dataclasses.dataclass
class Timing:
    median_us: float  # per call: (K-call replay - one-call replay) / (K - 1); K = 1: the one-call replay
    spread: float  # interquartile range / median
    rounds: int
    mode: str  # "cuda-graph", "cuda-events" or "cpu-wall"
    samples_us: List[float]  # per call
    note: str = ""
    calls: int = 1  # K, calls per timed replay
    single_us: Optional[float] = None  # median of the one-call replays
    single_spread: Optional[float] = None
    ratio_ci: Optional[float] = None  # adaptive rounds: the speedup's 95% CI half-width, relative
    median_ci: Optional[float] = None  # adaptive rounds: this runner's median's 95% CI half-width, relative


def _summary(samples_us: List[float], mode: str, note: str = "") -> Timing:
    q = statistics.quantiles(samples_us, n=4) if len(samples_us) >= 4 else [min(samples_us), 0, max(samples_us)]
    med = statistics.median(samples_us)
    return Timing(med, (q[2] - q[0]) / med if med else 0.0, len(samples_us), mode, samples_us, note)


def set_bytes(inputs: Mapping[str, Any]) -> int:
    """Bytes of one input set (whole storages: strided views keep their buffers)."""
    return sum(v.untyped_storage().nbytes() for v in inputs.values() if isinstance(v, torch.Tensor))


def calls_per_replay(single_us: float, nbytes: int) -> int:
    """K: enough calls that a replay lasts AMORTISE_TARGET_US, within the call and memory caps."""
    if single_us <= 0:
        return 1
    k = math.ceil(AMORTISE_TARGET_US / single_us)
    return max(1, min(k, MAX_CALLS_PER_REPLAY, MAX_AMORTISED_BYTES // max(nbytes, 1)))


class _GpuRunner:
    """One implementation over its own rotated input sets, as graph replays when possible: one
    graph per set (single calls) and, after :meth:`amortise`, one graph of K calls over K sets."""

    def __init__(self, module: torch.nn.Module, input_sets: Sequence[Mapping[str, Any]], use_graphs: bool,
                 call: Callable = None):
        self.module = module
        self.call = call or (lambda m, s: m(**s))
        self.sets = [clone_inputs(s) for s in input_sets]
        self.graphs: Optional[List[torch.cuda.CUDAGraph]] = None
        self.keep: List[Any] = []
        self.note = ""
        self.calls = 1
        self.multi: Optional[torch.cuda.CUDAGraph] = None
        self.multi_sets: List[Mapping[str, Any]] = []
        self.multi_keep: List[Any] = []
        with phase("warm_up"):  # billed apart from the capture: a bare machine compiles here
            self._warm(self.sets)
        # One memory pool for all of this runner's graphs, as serving stacks capture their batch
        # sizes: a graph's intermediates are free again once it ends, so the next capture reuses
        # them, and only the kept outputs add up. With a pool per graph, four rotated sets and the
        # K-call graph of a reference and a candidate held eight copies of a layer's activations
        # (36 GB of graph pools at Qwen3-Next's float32 8094-token mixed batch on an H100,
        # 2026-12-06, out of memory). Sharing is safe because the graphs replay one at a time on
        # one stream and an output is read (cloned) right after its own replay, before any other
        # graph can reuse its memory: a later capture may place its outputs in an earlier graph's
        # intermediates. The candidate's graphs never share the reference's pool.
        self.pool = torch.cuda.graph_pool_handle() if use_graphs else None
        if use_graphs:
            try:
                graphs = []
                for s in self.sets:
                    g = torch.cuda.CUDAGraph()
                    with torch.no_grad(), capture(g, self.pool):
                        self.keep.append(self.call(module, s))
                    graphs.append(g)
                self.graphs = graphs
            except Exception as exc:  # not capturable: time eager launches instead
                torch.cuda.synchronize()
                self.note = f"not capturable in a CUDA graph ({type(exc).__name__}: {exc}); eager launches timed"
                self.keep.clear()
        self.mode = "cuda-graph" if self.graphs else "cuda-events"

    def _warm(self, sets) -> None:
        """Compilation, autotuning and lazy tables happen here, on a side stream (as capture needs)."""
        with torch.no_grad():
            warm_up([lambda s=s: self.call(self.module, s) for s in sets], repeats=2)
        torch.cuda.synchronize()

    def amortise(self, extra_sets: Sequence[Mapping[str, Any]], calls: int, rotate: bool = True) -> None:
        """Capture ``calls`` calls in one graph: call j on set j (this runner's sets, then copies of
        ``extra_sets``), or all on set 0 when the case is L2-hot (``rotate=False``)."""
        if calls <= 1:
            return
        if rotate:
            self.multi_sets = (self.sets + [clone_inputs(s) for s in extra_sets])[:calls]
            self._warm(self.multi_sets[len(self.sets):])
        else:
            self.multi_sets = [self.sets[0]] * calls
        self.calls = calls
        if self.graphs:
            self.multi = torch.cuda.CUDAGraph()
            with torch.no_grad(), capture(self.multi, self.pool):
                self.multi_keep = [self.call(self.module, s) for s in self.multi_sets]

    def launch(self, i: int):
        """Set ``i``'s call; its outputs stay valid until another of this runner's graphs replays
        (they share one memory pool)."""
        if self.graphs:
            self.graphs[i % len(self.graphs)].replay()
            return self.keep[i % len(self.graphs)]
        with torch.no_grad():
            return self.call(self.module, self.sets[i % len(self.sets)])

    def launch_many(self):
        """All K calls (one replay; eager launches back to back when not capturable); returns the
        first call's outputs."""
        if self.multi is not None:
            self.multi.replay()
            return self.multi_keep[0]
        with torch.no_grad():
            outs = [self.call(self.module, s) for s in self.multi_sets]
        return outs[0]

    def verify(self, i: int, values: Mapping[str, Any], many: bool = False):
        """Put new values into set ``i``'s buffers, run the timed path once (the K-call replay with
        ``many``), return its outputs.

        The outputs are copied in stream order before synchronising, so work that escaped the
        timed stream, or a graph that replays nothing, shows as a wrong result.
        """
        if many:
            return _verify_launch(self, 0, values, buffers=self.multi_sets[0], launch=self.launch_many)
        return _verify_launch(self, i, values)


class L2Flusher:
    def __init__(self, device):
        props = torch.cuda.get_device_properties(device)
        size = max(int(getattr(props, "L2_cache_size", 64 << 20)) * 2, 32 << 20)
        self.buffer = torch.empty(size, dtype=torch.int8, device=device)

    def __call__(self) -> None:
        self.buffer.zero_()


class _CpuRunner:
    mode, note = "cpu-wall", "host clock on the CPU: informational only"

    def __init__(self, module: torch.nn.Module, input_sets: Sequence[Mapping[str, Any]], call: Callable = None):
        self.module = module
        self.call = call or (lambda m, s: m(**s))
        self.sets = [clone_inputs(s) for s in input_sets]
        self.timed_outputs: List[tuple] = []  # (input set, outputs) of each timed call

    def launch(self, i: int):
        with torch.no_grad():
            return self.call(self.module, self.sets[i % len(self.sets)])

    def verify(self, i: int, values: Mapping[str, Any]):
        return _verify_launch(self, i, values)


def _verify_launch(runner, i: int, values: Mapping[str, Any], buffers=None, launch=None):
    buffers = buffers if buffers is not None else runner.sets[i % len(runner.sets)]
    for k, v in values.items():
        if isinstance(v, torch.Tensor):
            refill(buffers[k], v)
    out = launch() if launch is not None else runner.launch(i)
    outs = [out] if isinstance(out, torch.Tensor) else list(out)
    copies = [o.clone() for o in outs]
    if torch.cuda.is_available() and any(o.is_cuda for o in copies):
        torch.cuda.synchronize()
    return copies


def refill(buffer: torch.Tensor, value: torch.Tensor) -> None:
    """Put ``value`` into ``buffer`` in place. A broadcast view (a stride 0 over a dimension of
    more than one element, as vLLM passes per-head values expanded over head_dim) cannot be written
    element by element; a value drawn the same way has the same layout, so the memory under the
    view is copied whole instead."""
    if not any(st == 0 and n > 1 for st, n in zip(buffer.stride(), buffer.shape)):
        buffer.copy_(value)
        return
    if (value.shape, value.stride(), value.storage_offset()) != (buffer.shape, buffer.stride(),
                                                                 buffer.storage_offset()) \
            or value.untyped_storage().nbytes() != buffer.untyped_storage().nbytes():
        raise ValueError(f"cannot refill a broadcast view {tuple(buffer.shape)} / {buffer.stride()} from a tensor "
                         f"of another layout {tuple(value.shape)} / {value.stride()}")

    def whole(t):
        return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())

    whole(buffer).copy_(whole(value))


def make_runners(candidate, reference, input_sets, device, call: Callable = None) -> Dict[str, Any]:
    """A runner per implementation; ``reference`` None: the candidate's alone (its side is known
    from the reference cache)."""
    impls = {"candidate": candidate, **({"reference": reference} if reference is not None else {})}
    if torch.device(device).type == "cuda":
        return {name: _GpuRunner(m, input_sets, True, call) for name, m in impls.items()}
    return {name: _CpuRunner(m, input_sets, call) for name, m in impls.items()}


def _event_pair():
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def flushed_replay_us(graph: "torch.cuda.CUDAGraph", flush: Callable[[], None], tries: int = 5) -> float:
    """Median time of a few replays of ``graph``, the L2 flushed before each (the GPU scripts and
    the GPU timing test use it where a whole graph is the unit timed)."""
    times = []
    for _ in range(tries):
        _lead_in(flush)
        start, end = _event_pair()
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def _lead_in(flush: Callable[[], None]) -> None:
    """What precedes every timed window: the L2 flush, then ``LEAD_CYCLES`` of GPU busy-wait."""
    flush()
    torch.cuda._sleep(LEAD_CYCLES)


def _estimate_single_us(runners: Dict[str, _GpuRunner], flusher: L2Flusher, tries: int = 4) -> Dict[str, float]:
    """Median single-call time per runner from a few flushed replays (picks K and the rounds)."""
    events = {name: [_event_pair() for _ in range(tries)] for name in runners}
    for i in range(tries):
        for name, r in runners.items():
            _lead_in(flusher)
            events[name][i][0].record()
            r.launch(i)
            events[name][i][1].record()
    torch.cuda.synchronize()
    return {name: statistics.median(a.elapsed_time(b) * 1e3 for a, b in evs) for name, evs in events.items()}


def time_pair_cuda(runners: Dict[str, _GpuRunner], flusher: L2Flusher, budget_s: float = 0.5,
                   min_rounds: int = 50, max_rounds: int = 500,
                   more_sets: Optional[Callable[[int], Sequence[Mapping[str, Any]]]] = None,
                   l2_hot: bool = False, target_ci: Optional[float] = None,
                   calls: Optional[int] = None, min_seconds: Optional[float] = None) -> Dict[str, Timing]:
    """Time every runner interleaved. With ``more_sets`` (n -> n fresh input sets) short calls are
    also timed amortised: K calls per replay (see the module docstring), the same K for all runners
    so their per-call times compare.

    The number of rounds is what ``budget_s`` buys, within ``min_rounds`` and ``max_rounds``. With
    ``target_ci`` (two runners only) the rounds stop earlier, once ``min_rounds`` are done and the
    95% confidence interval of the ratio of the two medians lies within +-``target_ci`` of it
    (checked every ``CI_CHECK_EVERY`` rounds; see :func:`ratio_ci`): rounds past that point move
    the speedup by less than the interval says and only cost time. One runner alone (the other
    side's time known from the reference cache) stops on the interval of its own median.
    ``calls`` fixes K (the cached side's), else it is chosen from the runners' one-call times.
    ``min_seconds``: rounds that long lower ``min_rounds`` to what that many seconds buy (never
    under ``SLOW_MIN_ROUNDS``; see :func:`min_rounds_for`)."""
    single = _estimate_single_us(runners, flusher)
    fixed_calls, calls = calls, 1
    if more_sets is not None:
        first = next(iter(runners.values()))
        calls = fixed_calls or calls_per_replay(min(single.values()), set_bytes(first.sets[0]))
        if calls > 1:
            extra = list(more_sets(calls - len(first.sets))) if l2_hot is False and calls > len(first.sets) else []
            for r in runners.values():
                r.amortise(extra, calls, rotate=not l2_hot)
            del extra
    windows = len(runners) * (2 if calls > 1 else 1)
    per_round_s = sum(single.values()) * (1 + calls) * 1e-6 + windows * (2e-5 + LEAD_S)
    if min_seconds is not None:
        min_rounds = min_rounds_for(per_round_s, min_rounds, min_seconds)
    rounds = int(min(max(budget_s / max(per_round_s, 1e-6), min_rounds), max_rounds))
    adaptive = target_ci is not None and len(runners) in (1, 2)

    events = {k: [_event_pair() for _ in range(rounds)] for k in runners}
    multi = {k: [_event_pair() for _ in range(rounds)] for k in runners} if calls > 1 else None
    order = list(runners)
    done, ci = rounds, None
    for i in range(rounds):
        for name in (order if i % 2 == 0 else order[::-1]):
            _lead_in(flusher)
            ev_start, ev_end = events[name][i]
            ev_start.record()
            runners[name].launch(i)
            ev_end.record()
            if multi is not None:
                _lead_in(flusher)
                ev_start, ev_end = multi[name][i]
                ev_start.record()
                runners[name].launch_many()
                ev_end.record()
        if adaptive and i + 1 >= min_rounds and (i + 1) % CI_CHECK_EVERY == 0 and i + 1 < rounds:
            torch.cuda.synchronize()
            per_call = [_per_call(events[n][:i + 1], multi[n][:i + 1] if multi else None, calls) for n in order]
            ci = ratio_ci(*per_call)
            if ci <= target_ci:
                done = i + 1
                break
    torch.cuda.synchronize()
    out = {}
    for name, r in runners.items():
        one = _summary([s.elapsed_time(e) * 1e3 for s, e in events[name][:done]], r.mode, r.note)
        if multi is None:
            one.single_us, one.single_spread = one.median_us, one.spread
            out[name] = one
        else:
            marginal = _marginal_us(events[name][:done], multi[name][:done], calls)
            _check_amortised(name, marginal, calls, one.median_us)
            timing = _summary(_clamped(marginal), r.mode, r.note)
            timing.calls, timing.single_us, timing.single_spread = calls, one.median_us, one.spread
            out[name] = timing
    if adaptive:
        ci = ratio_ci(*(out[n].samples_us for n in order)) if done == rounds or ci is None else ci
        for t in out.values():
            t.ratio_ci, t.median_ci = ci, ratio_ci(t.samples_us)
    return out


def min_rounds_for(per_round_s: float, min_rounds: int, min_seconds: float) -> int:
    """The fewest rounds worth running: ``min_rounds`` (which decode-sized calls need: their first
    rounds are still settling), but for rounds so long that ``min_seconds`` of them is fewer, what
    those seconds buy, and never under ``SLOW_MIN_ROUNDS``. A 1.6 s eager candidate ran 50 rounds,
    80 s for one case, where its median was settled long before (H200, 2026-12-05)."""
    return max(SLOW_MIN_ROUNDS, min(min_rounds, math.ceil(min_seconds / max(per_round_s, 1e-9))))


SLOW_MIN_ROUNDS = 10  # one check of the interval (CI_CHECK_EVERY) at least

CI_CHECK_EVERY = 10  # rounds between two checks of the ratio's confidence interval (one sync each)
BOOTSTRAP_RESAMPLES = 400


def _per_call(single_events, multi_events, calls: int) -> List[float]:
    """Per-call times of the rounds: the one-call replays, or the marginal cost of a call (the
    K-call replay minus the one-call replay, over K - 1; see the module docstring)."""
    if multi_events is None:
        return [s.elapsed_time(e) * 1e3 for s, e in single_events]
    return _clamped(_marginal_us(single_events, multi_events, calls))


def _marginal_us(single_events, multi_events, calls: int) -> List[float]:
    """Each round's (K-call replay - one-call replay) / (K - 1), as measured (zero or less possible)."""
    return [(m0.elapsed_time(m1) - s0.elapsed_time(s1)) * 1e3 / (calls - 1)
            for (m0, m1), (s0, s1) in zip(multi_events, single_events)]


def _clamped(marginal_us: Sequence[float]) -> List[float]:
    return [max(x, 1e-3) for x in marginal_us]


def _check_amortised(name: str, marginal_us: Sequence[float], calls: int, single_us: float) -> None:
    """Refuse a per-call time that is mostly clamp: when more than ``MAX_NONPOSITIVE_ROUNDS`` of
    the rounds' K-call replays were no longer than their one-call replays, the difference measures
    the host or the clock, not the calls (it read 0.001 us for a 3 us kernel once)."""
    bad = sum(x <= 0 for x in marginal_us)
    if marginal_us and bad > MAX_NONPOSITIVE_ROUNDS * len(marginal_us):
        raise TimingUnreliable(
            f"{name}: the {calls}-call replay was no longer than the one-call replay in {bad} of "
            f"{len(marginal_us)} rounds (one-call median {single_us:.2f} us): its per-call time cannot be "
            f"measured this way")


class TimingUnreliable(RuntimeError):
    """A timing loop whose samples do not measure what they claim to (see :func:`_check_amortised`)."""


def ratio_ci(a_us: Sequence[float], b_us: Optional[Sequence[float]] = None, level: float = 0.95,
             seed: int = 0) -> float:
    """Half-width of the ``level`` confidence interval of median(a) / median(b), relative to it
    (without ``b``: of median(a) itself).

    A paired bootstrap over rounds: round i of both runners is resampled together, so what moves
    both in one round (clocks, the other tenant of a shared host) stays paired, as it was timed."""
    a = torch.tensor(a_us, dtype=torch.float64)
    b = torch.tensor(b_us, dtype=torch.float64) if b_us is not None else None
    n = min(len(a), len(b)) if b is not None else len(a)
    if n < 4:
        return float("inf")
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(n, (BOOTSTRAP_RESAMPLES, n), generator=gen)
    ratios = a[:n][idx].median(dim=1).values
    center = float(a[:n].median())
    if b is not None:
        ratios = ratios / b[:n][idx].median(dim=1).values
        center /= float(b[:n].median())
    lo, hi = torch.quantile(ratios, torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64))
    return float(hi - lo) / 2 / center if center > 0 else float("inf")


def time_pair_cpu(runners: Dict[str, _CpuRunner], rounds: int = 1) -> Dict[str, Timing]:
    """Host-clock times on the CPU: informational only (an interpreted Triton kernel's wall time
    says nothing about its GPU time), so one round each, no warm-up; what matters on the CPU is
    that the timed path runs and is then checked (:func:`fk_pytest.speed._check_after_timing`)."""
    samples: Dict[str, List[float]] = {k: [] for k in runners}
    order = list(runners)
    for i in range(rounds):
        for name in (order if i % 2 == 0 else order[::-1]):
            t0 = time.perf_counter()
            out = runners[name].launch(i)
            samples[name].append((time.perf_counter() - t0) * 1e6)
            # What a timed call returned is checked too (there is no graph to replay on the CPU).
            runners[name].timed_outputs.append(
                (i, [o.clone() for o in ([out] if isinstance(out, torch.Tensor) else out)]))
    return {k: _summary(v, runners[k].mode, runners[k].note) for k, v in samples.items()}


def bench_clock(samples_us: Sequence[float]) -> Callable[[], float]:
    """A clock for pytest-benchmark that advances by the measured GPU times, one per call.

    pytest-benchmark reads its timer around each round; handing it this clock (instead of a host
    clock) makes its statistics, JSON and comparisons carry the GPU times measured above.
    """
    state = {"now": 0.0, "next": 0}

    def gpu_time_clock() -> float:
        return state["now"]

    def advance() -> None:
        state["now"] += samples_us[state["next"] % len(samples_us)] * 1e-6
        state["next"] += 1

    gpu_time_clock.advance = advance
    return gpu_time_clock


ROOFLINE_REPS = 30  # timed repetitions of each roofline op; the fastest counts
ROOFLINE_WARM_S = 0.05  # seconds of the op run untimed first, so the clocks are up


def measure_roofline(device, reps: int = ROOFLINE_REPS, statistic: str = "best") -> Dict[str, float]:
    """Copy bandwidth and bf16 GEMM rate of this GPU, measured now with the same event timing.

    A roofline is a ceiling, so the fastest repetition counts (``statistic="best"``), after about
    ``ROOFLINE_WARM_S`` of untimed work. The median of ten, used until 2026-12-06, read the copy of
    one H100 at 2.59 to 2.98 TB/s across eight calls in one process (docs/perf/h100-2026-12-06e.md),
    and every "fraction of copy" moved with it. ``statistic="median"`` keeps that estimator for
    ``python3 -m benchmarks roofline``, which compares the two."""
    if statistic not in ("best", "median"):
        raise ValueError(f"statistic must be 'best' or 'median', got {statistic!r}")
    pick = min if statistic == "best" else statistics.median

    def ms(fn):
        def once():
            a, b = _event_pair()
            a.record()
            fn()
            b.record()
            b.synchronize()
            return a.elapsed_time(b)

        fn()
        torch.cuda.synchronize()
        if statistic == "best":
            for _ in range(int(ROOFLINE_WARM_S / max(once() * 1e-3, 1e-6))):
                fn()
        return pick([once() for _ in range(reps)])

    n = 1 << 30
    src = torch.empty(n, dtype=torch.int8, device=device).random_()
    dst = torch.empty_like(src)
    copy_ms = ms(lambda: dst.copy_(src))
    del src, dst
    m = 8192
    a = torch.randn(m, m, device=device, dtype=torch.bfloat16)
    b = torch.randn(m, m, device=device, dtype=torch.bfloat16)
    gemm_ms = ms(lambda: a @ b)
    return {"copy_tbps": 2 * n / (copy_ms * 1e-3) / 1e12, "bf16_gemm_tflops": 2 * m ** 3 / (gemm_ms * 1e-3) / 1e12}
