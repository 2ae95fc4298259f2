"""Which GPU kernels a reference module launches on a task's cases, and how long each takes.

For each named task and each of its full-profile cases whose id contains ``--case`` (all by
default), the reference module is built as the task builds it, called three times to warm up
(compilation, autotuning, lazy tables), then five times under ``torch.profiler``; the kernels' mean
time per call comes out largest first, with the wall time per call beside it:

    python3 -m benchmarks kernel_breakdown global_response_norm --case B32
    python3 -m benchmarks kernel_breakdown mamba_chunk_scan --case one-zero --peer mamba-ssm

``--peer NAME`` lists that peer's kernels too (a peer of the op in tasks/peers.py, built as
``python3 -m fk_pytest.peers`` builds it, on the same inputs): where a library spends its time
where the reference spends more; the configs its Triton autotuners chose follow its kernels (a
library tuned per GPU tells which tiles won on this one).
"""
import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from fk_pytest.registry import get_task

WARMUP_CALLS, PROFILED_CALLS, TOP = 3, 5, 6


def kernel_times(call, calls: int = PROFILED_CALLS):
    """[(kernel, us per call)] of the GPU kernels ``call()`` launches (torch.profiler over ``calls``
    calls), largest first."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    kernels = {}
    for event in prof.key_averages():
        us = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)
        if us:
            kernels[event.key] = us / calls
    return sorted(kernels.items(), key=lambda kv: -kv[1])


def autotuned_choices():
    """{kernel: [chosen config per tuned key]} of every Triton autotuner in loaded modules outside
    kernels_reference: what a library's autotuning picked on this GPU for the shapes it saw."""
    import sys
    import warnings

    from triton.runtime.autotuner import Autotuner

    chosen = {}
    with warnings.catch_warnings():  # deprecated module attributes (torch.distributed.reduce_op) warn when looked at
        warnings.simplefilter("ignore")
        for mod_name, mod in list(sys.modules.items()):
            if mod is None or mod_name.startswith("kernels_reference"):
                continue
            for attr, value in list(vars(mod).items()):
                if isinstance(value, Autotuner) and value.cache:
                    chosen[f"{mod_name}.{attr}"] = [str(config) for config in value.cache.values()]
    return chosen


def breakdown(task, case, device, peer_name=None):
    module = task.reference(**task.init_args(case)).to(device=device, dtype=case.dtype).eval()
    inputs = task.make_inputs(case, torch.Generator(device=device).manual_seed(0), device)
    call = lambda: task.call(module, inputs)  # noqa: E731
    if peer_name:
        from fk_pytest.peers.contract import PeerContext, suite_ops

        peers = suite_ops()[task.name].peers
        peer = next((p for p in peers if p.name == peer_name), None)
        if peer is None:
            raise SystemExit(f"{task.name} has no peer {peer_name!r}: " + ", ".join(p.name for p in peers))
        fn = peer.build(PeerContext(task, case, module, dict(module.state_dict()), device, compile=True))
        call = lambda: fn(inputs)  # noqa: E731
    with torch.no_grad():
        for _ in range(WARMUP_CALLS):
            call()
        torch.cuda.synchronize()
        start = time.perf_counter()
        kernels = kernel_times(call)
        wall_us = (time.perf_counter() - start) / PROFILED_CALLS * 1e6
    return wall_us, kernels


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tasks", nargs="+")
    parser.add_argument("--case", default="", help="only cases whose id contains this")
    parser.add_argument("--peer", help="also list this peer's kernels on the same cases")
    args = parser.parse_args()
    device = torch.device("cuda")
    for name in args.tasks:
        task = get_task(name)
        for case in task.cases("full"):
            if args.case not in case.id:
                continue
            for who in ["reference"] + ([args.peer] if args.peer else []):
                wall_us, kernels = breakdown(task, case, device, None if who == "reference" else who)
                total = sum(us for _, us in kernels)
                print(f"{name} {case.id} [{who}]: {total:.1f} us of kernels, {wall_us:.1f} us wall per call")
                for key, us in kernels[:TOP]:
                    print(f"    {us:9.1f} us  {key[:90]}")
                if who != "reference":
                    for kernel, configs in autotuned_choices().items():
                        print(f"    tuned {kernel}: " + " | ".join(configs))


if __name__ == "__main__":
    main()
