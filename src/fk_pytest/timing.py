"""GPU time of candidate and reference, measured side by side.

Method (DESIGN "Speed"): each implementation gets its own copies of several input sets (rotation:
no round reuses the previous round's data or output); each call is captured in a CUDA graph when
the module allows it (production runs small kernels inside graphs), else it is launched eagerly.
Every timed round starts with an L2 flush outside the timed window; candidate and reference rounds
alternate in one process, the order flipping each round; all events are read after one final
synchronisation so the host never starves the GPU between rounds. The median is the time, the
interquartile range over the median the spread. On the CPU the same loop uses a host clock and the
result is informational only.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import torch

from .build import clone_inputs


@dataclasses.dataclass
class Timing:
    median_us: float
    spread: float  # interquartile range / median
    rounds: int
    mode: str  # "cuda-graph", "cuda-events" or "cpu-wall"
    samples_us: List[float]
    note: str = ""


def _summary(samples_us: List[float], mode: str, note: str = "") -> Timing:
    q = statistics.quantiles(samples_us, n=4) if len(samples_us) >= 4 else [min(samples_us), 0, max(samples_us)]
    med = statistics.median(samples_us)
    return Timing(med, (q[2] - q[0]) / med if med else 0.0, len(samples_us), mode, samples_us, note)


class _GpuRunner:
    """One implementation over its own rotated input sets, as graph replays when possible."""

    def __init__(self, module: torch.nn.Module, input_sets: Sequence[Mapping[str, Any]], use_graphs: bool,
                 call: Callable = None):
        self.module = module
        self.call = call or (lambda m, s: m(**s))
        self.sets = [clone_inputs(s) for s in input_sets]
        self.graphs: Optional[List[torch.cuda.CUDAGraph]] = None
        self.keep: List[Any] = []
        self.note = ""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():
            for _ in range(2):  # compilation, autotuning and lazy tables happen here
                for s in self.sets:
                    self.call(module, s)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        if use_graphs:
            try:
                graphs = []
                for s in self.sets:
                    g = torch.cuda.CUDAGraph()
                    with torch.no_grad(), torch.cuda.graph(g):
                        self.keep.append(self.call(module, s))
                    graphs.append(g)
                self.graphs = graphs
            except Exception as exc:  # not capturable: time eager launches instead
                torch.cuda.synchronize()
                self.note = f"not capturable in a CUDA graph ({type(exc).__name__}: {exc}); eager launches timed"
                self.keep.clear()
        self.mode = "cuda-graph" if self.graphs else "cuda-events"

    def launch(self, i: int):
        if self.graphs:
            self.graphs[i % len(self.graphs)].replay()
            return self.keep[i % len(self.graphs)]
        with torch.no_grad():
            return self.call(self.module, self.sets[i % len(self.sets)])

    def verify(self, i: int, values: Mapping[str, Any]):
        """Put new values into set ``i``'s buffers, run the timed path once, return its outputs.

        The outputs are copied in stream order before synchronising, so work that escaped the
        timed stream, or a graph that replays nothing, shows as a wrong result.
        """
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

    def launch(self, i: int):
        with torch.no_grad():
            return self.call(self.module, self.sets[i % len(self.sets)])

    def verify(self, i: int, values: Mapping[str, Any]):
        return _verify_launch(self, i, values)


def _verify_launch(runner, i: int, values: Mapping[str, Any]):
    buffers = runner.sets[i % len(runner.sets)]
    for k, v in values.items():
        if isinstance(v, torch.Tensor):
            buffers[k].copy_(v)
    out = runner.launch(i)
    outs = [out] if isinstance(out, torch.Tensor) else list(out)
    copies = [o.clone() for o in outs]
    if torch.cuda.is_available() and any(o.is_cuda for o in copies):
        torch.cuda.synchronize()
    return copies


def make_runners(candidate, reference, input_sets, device, call: Callable = None) -> Dict[str, Any]:
    if torch.device(device).type == "cuda":
        return {"candidate": _GpuRunner(candidate, input_sets, True, call),
                "reference": _GpuRunner(reference, input_sets, True, call)}
    return {"candidate": _CpuRunner(candidate, input_sets, call), "reference": _CpuRunner(reference, input_sets, call)}


def time_pair_cuda(runners: Dict[str, _GpuRunner], flusher: L2Flusher, budget_s: float = 0.5,
                   min_rounds: int = 50, max_rounds: int = 500) -> Dict[str, Timing]:
    # Estimate a round's cost to pick the number of rounds within the time budget.
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(4):
        for r in runners.values():
            flusher()
            r.launch(i)
    end.record()
    torch.cuda.synchronize()
    per_round_s = max(start.elapsed_time(end) / 4e3, 1e-6)
    rounds = int(min(max(budget_s / per_round_s, min_rounds), max_rounds))

    events = {k: [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(rounds)] for k in runners}
    order = list(runners)
    for i in range(rounds):
        for name in (order if i % 2 == 0 else order[::-1]):
            flusher()
            ev_start, ev_end = events[name][i]
            ev_start.record()
            runners[name].launch(i)
            ev_end.record()
    torch.cuda.synchronize()
    return {name: _summary([s.elapsed_time(e) * 1e3 for s, e in events[name]],
                           runners[name].mode, runners[name].note)
            for name in runners}


def time_pair_cpu(runners: Dict[str, _CpuRunner], rounds: int = 3) -> Dict[str, Timing]:
    samples: Dict[str, List[float]] = {k: [] for k in runners}
    for r in runners.values():
        r.launch(0)  # warm-up (Triton interpreter / JIT set-up)
    order = list(runners)
    for i in range(rounds):
        for name in (order if i % 2 == 0 else order[::-1]):
            t0 = time.perf_counter()
            runners[name].launch(i)
            samples[name].append((time.perf_counter() - t0) * 1e6)
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


def measure_roofline(device) -> Dict[str, float]:
    """Copy bandwidth and bf16 GEMM rate of this GPU, measured now with the same event timing."""
    def median_ms(fn, reps=10):
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        return statistics.median(times)

    n = 1 << 30
    src = torch.empty(n, dtype=torch.int8, device=device).random_()
    dst = torch.empty_like(src)
    copy_ms = median_ms(lambda: dst.copy_(src))
    del src, dst
    m = 8192
    a = torch.randn(m, m, device=device, dtype=torch.bfloat16)
    b = torch.randn(m, m, device=device, dtype=torch.bfloat16)
    gemm_ms = median_ms(lambda: a @ b)
    return {"copy_tbps": 2 * n / (copy_ms * 1e-3) / 1e12, "bf16_gemm_tflops": 2 * m ** 3 / (gemm_ms * 1e-3) / 1e12}
