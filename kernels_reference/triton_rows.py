"""Describe the rows of a tensor's last dimension to a Triton kernel without copying.

Production feeds row-wise kernels strided views: Qwen3 normalises q and k per head on views of the
fused qkv projection ([T, heads, head_dim] with a row stride of the whole qkv width). A kernel that
assumed packed rows would read the wrong memory, so row offsets are computed from two strides:
row r starts at (r // n_inner) * stride_outer + (r % n_inner) * stride_inner.
"""
import functools
import os
from typing import NamedTuple, Optional

import torch


class RowLayout(NamedTuple):
    tensor: torch.Tensor  # the (possibly made contiguous) tensor the offsets refer to
    n_rows: int
    n_inner: int
    stride_outer: int
    stride_inner: int


def row_layout(x: torch.Tensor) -> RowLayout:
    if x.dim() == 0:
        raise ValueError("expected a tensor with at least one dimension")
    if x.stride(-1) != 1:
        x = x.contiguous()
    width = x.shape[-1]
    if x.dim() == 1:
        return RowLayout(x, 1, 1, 0, 0)
    n_rows = x.numel() // width if width else 0
    try:
        flat = x.view(-1, width)
        return RowLayout(x, n_rows, 1, flat.stride(0), 0)
    except RuntimeError:
        pass
    try:
        three = x.view(-1, x.shape[-2], width)
        return RowLayout(x, n_rows, three.shape[1], three.stride(0), three.stride(1))
    except RuntimeError:
        x = x.contiguous()
        return RowLayout(x, n_rows, 1, width, 0)


def warps_for(block: int) -> int:
    return 1 if block <= 256 else 2 if block <= 1024 else 4 if block <= 4096 else 8


# ---- launch configuration: autotuned on CUDA, fixed in the interpreter ------------------------------
# Inductor tunes every kernel it generates for the shapes it sees; a hand-written reference with one
# fixed launch loses a few percent to it on some shapes. The modules therefore keep two launchers
# over one kernel body: an autotuned one for real GPUs and the plain jit one with a fixed config for
# the CPU interpreter (CI), where benchmarking configs is impossible and pointless. Autotuning runs
# on the first call with a new key, which the suite and the engine make outside CUDA-graph capture
# (their warm-up calls); the kernels only write fresh output buffers, so re-running a config while
# tuning needs no restore of its arguments.


# Up to this many rows a launch is latency-bound: every config times within noise, so a fixed one is
# used instead of autotuning (which would otherwise pick among equals at random, per process).
DECODE_ROWS = 256


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def whole_tiles() -> bool:
    """Whether a kernel should take whole heads or chunks per program: under the CPU interpreter,
    which pays per program and per op rather than per element, unless ``FK_GPU_TILES=1`` asks for
    the GPU's tiles there (the tests that check the GPU's tiling, masks and grid order on the CPU)."""
    return interpreting() and os.environ.get("FK_GPU_TILES", "0") in ("", "0")


def autotune_here(t: torch.Tensor) -> bool:
    """Whether launches on ``t`` go through the autotuned kernel (a real GPU, not the interpreter)."""
    return t.is_cuda and not interpreting()


# Triton's autotuner benchmarks every config for 25 ms of warm-up and 100 ms of repetitions; with
# 4-12 configs a key, and a key per width and row bucket, that was most of a task's cold run (the
# reference side of rms_norm's 98 cases: 68 of 133 s on the H200, 2026-12-03,
# docs/perf/h200-suite-cost.md). A few ms of each still time a config over tens of launches, which
# separates configs that differ by more than noise; configs closer than that are equals. Results go
# to Triton's on-disk cache as well, so the pytest process, the sterile worker and a later run on
# the same machine tune each key once.
TUNE_WARMUP_MS, TUNE_REP_MS = 3, 15


def autotune(configs, key, **kwargs):
    """``triton.autotune`` with the short benchmark above and results kept on disk (where this
    Triton has those options)."""
    import inspect

    import triton
    import triton.testing

    def bench(kernel_call, quantiles=None, **_):
        return triton.testing.do_bench(kernel_call, warmup=TUNE_WARMUP_MS, rep=TUNE_REP_MS, quantiles=quantiles)

    accepted = inspect.signature(triton.autotune).parameters
    extra = {k: v for k, v in (("do_bench", bench), ("cache_results", True)) if k in accepted}
    return triton.autotune(configs=configs, key=key, **extra, **kwargs)


def size_class(n: int) -> int:
    """The power-of-4 bucket of a row/token count (1, 4, 16, ...): the shape part of an autotune
    key, coarse so a serving run with many batch sizes tunes a handful of times.

    Uncapped: the buckets once stopped at 16384, so every count from 4097 rows up shared one
    tuning, and the config tuned on whichever came first ran all of them. Per-head norms put a
    decode batch of 143 tokens (4576 rows of 128) and a 16384-token prefill (524288 rows) in that
    bucket; tuned on the first, where configs are within noise of each other, the prefill ran up to
    4x slower than its own best (Qwen3 q-norm at T8192: 162.7 against 41.7 us in two runs of the
    same reference on the H200, 2026-12-03, docs/perf/h200-suite-cost.md)."""
    bucket = 1
    while bucket < n:
        bucket *= 4
    return bucket


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """SMs of a CUDA device (launch sizing); the interpreter on the CPU is given a small fixed machine."""
    if device.type != "cuda":
        return 4
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def resident_programs_per_sm(compile_kernel, device: torch.device) -> Optional[int]:
    """Programs of a kernel (``compile_kernel()`` returns Triton's compiled kernel) that fit on one
    SM at once (registers, shared memory, threads), or None when the compiled kernel or the device
    does not say (a kernel that does not compile fails at its launch, with Triton's own message)."""
    try:
        compiled = compile_kernel()
        compiled._init_handles()
        regs, shared, warps = compiled.n_regs, compiled.metadata.shared, compiled.metadata.num_warps
        props = torch.cuda.get_device_properties(device)
    except Exception:  # noqa: BLE001 - another Triton's internals: fall back to the config
        return None
    regs_per_warp = -(-max(regs, 1) * 32 // 256) * 256  # registers are allocated per warp, 256 at a time
    by_regs = getattr(props, "regs_per_multiprocessor", 65536) // (regs_per_warp * warps)
    by_smem = getattr(props, "shared_memory_per_multiprocessor", 233472) // (shared + 1024)  # 1 KiB reserved per block
    by_threads = props.max_threads_per_multi_processor // (32 * warps)
    return max(1, min(by_regs, by_smem, by_threads, 32))


_RESIDENT: dict = {}


def cached_resident_programs(key: tuple, compile_kernel, device: torch.device) -> Optional[int]:
    """``resident_programs_per_sm`` once per ``device`` and ``key`` (an owner's name first, then what
    selects the compiled kernel); without ``compile_kernel`` only what an earlier call found (None if
    nothing)."""
    key = (str(device), *key)  # one GPU's footprint says nothing of another kind's
    resident = _RESIDENT.get(key)
    if resident is None and compile_kernel is not None:  # compile once, read the footprint
        resident = _RESIDENT[key] = resident_programs_per_sm(compile_kernel, device)
    return resident


def splits_in_one_wave(pairs: int, sms: int, per_sm: int, cap: int) -> int:
    """Splits per work pair that keep ``pairs`` x splits programs within one wave of ``per_sm``
    resident programs on ``sms`` SMs, rounded down so that all start together; 1 to ``cap``."""
    return max(1, min(cap, per_sm * sms // max(pairs, 1)))
