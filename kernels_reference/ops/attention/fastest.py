"""The faster of several kernels for one shape, chosen on its first call by GPU time.

A layer with more than one kernel for a shape (``kernels_reference.L1.encoder_attention``: cuDNN,
FlashAttention over the valid keys, the key-span Triton kernel) hands ``fastest`` a key and its
options as calls. On the key's first call, outside CUDA-graph capture (as Triton's autotuner
tunes), every option is run once and checked against the first one's output (``AGREE_L2``); the
ones that agree are timed as CUDA-graph replays (``graph_ms``), and the fastest is kept for the key.
"""
import warnings
from typing import Callable, Dict

import torch

from ...cuda_graphs import capture, warm_up

_CHOSEN: Dict[tuple, str] = {}  # shape key -> the option that won
TUNED: Dict[tuple, Dict[str, float]] = {}  # shape key -> each option's best ms (benchmarks/encoder_choices.py)
TUNE_CALLS = 5  # calls per option and round; two rounds, interleaved, the faster round counts


# Two kernels computing the same attention differ by their rounding (bf16: well under 1% of the
# output's norm); an option further than this from the first (the established kernel) computes
# something else, and is dropped rather than timed.
AGREE_L2 = 2e-2


def fastest(key: tuple, options: Dict[str, Callable[[], torch.Tensor]]) -> torch.Tensor:
    """The result of the faster of ``options`` (the same attention by different kernels) for this
    shape: checked and timed on its first call, outside CUDA-graph capture; during capture before
    any timing, the first option. An option that raises, or whose output is not the first
    option's, is dropped; if all raise, the first one's error is raised."""
    choice = _CHOSEN.get(key)
    if choice is None:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return next(iter(options.values()))()
        TUNED[key] = time_options(options)
        choice = _CHOSEN[key] = min(TUNED[key], key=TUNED[key].get)
    return options[choice]()


def graph_ms(call: Callable[[], torch.Tensor]) -> float:
    """Milliseconds of ``TUNE_CALLS`` calls replayed as one CUDA graph: GPU time, as a serving
    stack's graphs pay it. Back-to-back eager calls timed the host's launches as much as the
    kernels: on an H100 (2026-12-06) SDPA's cuDNN kernel read 105 us a call that way on MiniLM's
    padded B8 S512 batch where its graph replay takes 37 us, and the choice between kernels was
    made on launch overhead. A call that cannot be captured is timed as eager calls."""
    def several():
        for _ in range(TUNE_CALLS):
            call()

    run = several
    try:
        graph = torch.cuda.CUDAGraph()
        warm_up([call])  # capture wants the call's lazy work (workspaces, tables) done first
        with capture(graph):
            several()
        graph.replay()
        run = graph.replay
    except RuntimeError:
        torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def _agrees(out: torch.Tensor, baseline: torch.Tensor) -> bool:
    if out.shape != baseline.shape or not bool(torch.isfinite(out).all()):
        return False
    diff = (out.float() - baseline.float()).norm()
    return bool(diff <= AGREE_L2 * baseline.float().norm())


def time_options(options: Dict[str, Callable[[], torch.Tensor]],
                 timer: Callable[[Callable[[], torch.Tensor]], float] = graph_ms) -> Dict[str, float]:
    """Each option's faster of two interleaved rounds (ms for TUNE_CALLS calls); inf where it
    raised or disagreed with the first option that ran."""
    best: Dict[str, float] = {}
    first_error, baseline = None, None
    for name, call in options.items():  # each option once: does it run, and compute the same?
        try:
            out = call()
        except RuntimeError as exc:
            first_error = first_error or exc
            best[name] = float("inf")
            continue
        if baseline is None:
            baseline = out
        elif not _agrees(out, baseline):
            warnings.warn(f"the {name} kernel's output differs from the first kernel's "
                          f"by more than {AGREE_L2:.0%} (relative L2) on this shape; it is not used")
            best[name] = float("inf")
    if baseline is None:
        raise first_error
    for _ in range(2):
        for name, call in options.items():
            if best.get(name) != float("inf"):
                best[name] = min(best.get(name, float("inf")), timer(call))
    return best
