"""Amortised CUDA-graph timing for the GPU scripts (benchmarks/*.py), the method of
``fk_pytest.timing``: a graph of one call and a graph of K calls, each call on its own input set
so no call finds its bytes in L2 from the call before; per call = (K-call - one-call) / (K - 1).
Implementations are timed interleaved (order flipped each round), the L2 flushed before every
replay, all events read after one final synchronisation."""
import contextlib
import functools
import statistics
import time

import torch

from kernels_reference.cuda_graphs import capture, warm_up  # capture reports the operation that broke it


class AmortisedGraphs:
    """One implementation: ``one`` replays calls[0], ``many`` replays calls[0..K-1] (zero-argument
    callables); ``one_out`` / ``many_out`` are their outputs. ``warmup`` (default: every call) runs
    on a side stream first (compilation, autotuning, lazy buffers), all inside ``context()``."""

    def __init__(self, calls, warmup=None, context=None):
        self.calls = len(calls)
        with (context or contextlib.nullcontext)(), torch.no_grad():
            warm_up(calls if warmup is None else warmup)
            torch.cuda.synchronize()
            self.one = torch.cuda.CUDAGraph()
            with capture(self.one):
                self.one_out = calls[0]()
            self.many = torch.cuda.CUDAGraph()
            with capture(self.many):
                self.many_out = [fn() for fn in calls]


def over_sets(fn, sets, calls, context=None) -> AmortisedGraphs:
    """``fn`` on sets[0..calls-1] (warmed up on the first two sets)."""
    return AmortisedGraphs([functools.partial(fn, s) for s in sets[:calls]],
                           warmup=[functools.partial(fn, s) for s in sets[:2]], context=context)


def time_amortised(runners, flush, rounds):
    """Per-call us of every runner (name -> AmortisedGraphs): us (median), spread (IQR / median),
    single_us (the one-call replay), calls (K), rounds, mode."""
    names = list(runners)
    ev = {n: [[torch.cuda.Event(enable_timing=True) for _ in range(4)] for _ in range(rounds)] for n in names}
    for i in range(rounds):
        for n in (names if i % 2 == 0 else names[::-1]):
            e = ev[n][i]
            flush()
            e[0].record()
            runners[n].one.replay()
            e[1].record()
            flush()
            e[2].record()
            runners[n].many.replay()
            e[3].record()
    torch.cuda.synchronize()
    out = {}
    for n in names:
        k = runners[n].calls
        one = [e[0].elapsed_time(e[1]) * 1e3 for e in ev[n]]
        many = [e[2].elapsed_time(e[3]) * 1e3 for e in ev[n]]
        per_call = sorted((m - o) / (k - 1) for m, o in zip(many, one))
        med = statistics.median(per_call)
        q1, q3 = per_call[len(per_call) // 4], per_call[3 * len(per_call) // 4]
        out[n] = {"us": med, "spread": (q3 - q1) / med if med > 0 else 0.0, "single_us": statistics.median(one),
                  "calls": k, "rounds": rounds, "mode": "cuda-graph amortised"}
    return out


def add_times(rows: dict, runners, flush, rounds: int, moved_bytes: int, baseline: str = "inductor") -> dict:
    """Time ``runners`` (name -> AmortisedGraphs) interleaved and write each one's us, spread, TB/s
    (``moved_bytes`` a call) and ``vs_<baseline>`` (the baseline's time / its own) into ``rows``."""
    for name, t in time_amortised(runners, flush, rounds).items():
        rows[name].update(us=t["us"], spread=t["spread"], tb_s=moved_bytes / (t["us"] * 1e-6) / 1e12)
    base = rows.get(baseline, {}).get("us")
    for r in rows.values():
        if base and r.get("us"):
            r[f"vs_{baseline}"] = base / r["us"]
    return rows


def graph_kernel_breakdown(graph, reps: int = 5) -> dict:
    """Where a decode step's GPU time goes: the kernels of ``reps`` replays of ``graph`` under the
    PyTorch profiler (CUPTI reports each kernel of a graph launch), per replay: launches and time
    per kernel name, their sum, and the replay's own time (the difference is time between kernels)."""
    from torch.profiler import ProfilerActivity, profile

    replay_ms(graph, 3)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            graph.replay()
        torch.cuda.synchronize()
    kernels = []
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None)
        us = getattr(e, "cuda_time_total", 0.0) if us is None else us
        if us and e.count:
            kernels.append({"kernel": e.key[:90], "launches": e.count / reps, "us": us / reps})
    kernels.sort(key=lambda k: -k["us"])
    total_us = sum(k["us"] for k in kernels)
    return {"replay_ms": replay_ms(graph, 20), "kernel_sum_ms": total_us / 1e3,
            "launches": sum(k["launches"] for k in kernels), "top": kernels[:14]}


def replay_ms(graph, reps: int) -> float:
    """Mean GPU time of back-to-back replays of a captured graph (after one warm replay)."""
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


class Timer:
    """Median time of ``fn``: CUDA-graph replay when capturable, L2 flushed before every call; on
    the CPU (the benchmarks' smoke runs) one host-clock call after a warm one."""

    def __init__(self, device, budget_s: float = 0.15):
        self.device, self.budget_s = torch.device(device), budget_s
        self.cuda = self.device.type == "cuda"
        if self.cuda:
            from fk_pytest.timing import L2Flusher
            self.flush = L2Flusher(self.device)

    def __call__(self, fn, budget_s=None, graph=True):
        budget_s = self.budget_s if budget_s is None else budget_s
        if not self.cuda:
            fn()
            t0 = time.perf_counter()
            fn()
            return {"us": (time.perf_counter() - t0) * 1e6, "mode": "cpu-wall"}
        warm_up([fn], repeats=2)
        torch.cuda.synchronize()
        run, mode = fn, "cuda-events"
        if graph:
            try:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    fn()
                run, mode = g.replay, "cuda-graph"
            except Exception as exc:  # noqa: BLE001 - not capturable: time eager launches
                torch.cuda.synchronize()
                mode = f"cuda-events ({type(exc).__name__})"
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        torch.cuda.synchronize()
        rounds = int(min(max(budget_s / max(a.elapsed_time(b) * 1e-3, 1e-6), 5), 100))
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(rounds)]
        for start, end in events:
            self.flush()
            start.record()
            run()
            end.record()
        torch.cuda.synchronize()
        samples = [s.elapsed_time(e) * 1e3 for s, e in events]
        return {"us": statistics.median(samples), "mode": mode, "rounds": rounds}
