"""The attention task's prefill and mixed batches on one GPU: cuDNN's two-pass prefill against the
SDPA call per sequence it replaced, side by side on the task's own inputs.

    python3 -m benchmarks mixed_prefill              # H100 / H200, about a minute
    python3 -m benchmarks mixed_prefill --cases B118 # only case ids containing B118

For every full-profile case of tasks/L1/test_attention.py that is not a pure decode (Llama-3.1-8B,
32/8 heads, and Qwen2.5-7B, 28/4; the captured mixed batches B33 and B118 and the B8 x 1024
prefill):

1. both paths' error against the float64 truth (``forward_native``); ``err_ratio`` is the
   two-pass error over the loop's, the suite's own measure (fk_pytest.compare.output_error);
2. GPU time, amortised CUDA-graph replays (benchmarks/graph_timing.py) over several input sets,
   the two paths interleaved, L2 flushed before every replay; TFLOP/s from the task's own flop
   count;
3. for the largest mixed batch of each model, where the two-pass path's time goes (kernels of
   its graph under the profiler).

Writes $OUT/mixed_prefill.json when OUT is set; prints the table last.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "src")]

import torch  # noqa: E402

from benchmarks.graph_timing import graph_kernel_breakdown, over_sets, time_amortised  # noqa: E402
from benchmarks.markdown import md_table  # noqa: E402
from fk_pytest.compare import output_error  # noqa: E402
from kernels_reference.L1.attention import Attention  # noqa: E402
from kernels_reference.ops.attention import sdpa_prefill  # noqa: E402
from tasks.L1.test_attention import TASK  # noqa: E402

MODELS = ("llama-3.1-8b", "qwen2.5-7b")
SETS = 4  # input sets per case: K of the amortised graph
ROUNDS = 15
PATHS = {"loop": False, "two-pass": True}


@contextlib.contextmanager
def prefill_path(two_pass: bool):
    saved = sdpa_prefill.PREFILL_CONFIG
    sdpa_prefill.PREFILL_CONFIG = dataclasses.replace(saved, two_pass=two_pass)
    try:
        yield
    finally:
        sdpa_prefill.PREFILL_CONFIG = saved


def cases(only: str):
    return [c for c in TASK.cases("full") if c.model in MODELS and "-decode-" not in c.id and only in c.id]


def inputs(case, seed: int, device, dtype=None):
    gen = torch.Generator(device=device).manual_seed(seed)
    made = TASK.make_inputs(case, gen, device)
    if dtype is not None:
        made = {k: (v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() else v) for k, v in made.items()}
    return made


def check(case, module, device) -> dict:
    """Each path's output on a copy of one input set, against the float64 truth."""
    base = inputs(case, 0, device)
    truth_inputs = {k: (v.double() if torch.is_tensor(v) and v.is_floating_point() else v) for k, v in base.items()}
    with torch.no_grad():
        truth = TASK.call(module, truth_inputs, method="forward_native").clone()
        del truth_inputs
        outs = {}
        for name, two_pass in PATHS.items():
            run = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in base.items()}
            with prefill_path(two_pass):
                outs[name] = TASK.call(module, run).clone()
    err = output_error("out", truth, [outs["loop"]], outs["two-pass"], case.dtype)
    return {"err_loop": err.e_ref, "err_two_pass": err.e_cand, "err_ratio": err.ratio,
            "max_abs_diff": float((outs["two-pass"].float() - outs["loop"].float()).abs().max())}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default="", help="only case ids containing this text")
    args = p.parse_args()
    device = torch.device("cuda")
    from fk_pytest.timing import L2Flusher
    flush = L2Flusher(device)
    rows, breakdowns = [], {}
    for case in cases(args.cases):
        module = Attention(**TASK.init_args(case)).to(device)
        row = {"case": case.id, "weight": case.weight, **check(case, module, device)}
        sets = [inputs(case, seed, device) for seed in range(SETS)]

        def call(s):
            return TASK.call(module, s)

        runners = {name: over_sets(call, sets, SETS, context=functools.partial(prefill_path, two_pass))
                   for name, two_pass in PATHS.items()}
        times = time_amortised(runners, flush, ROUNDS)
        flops = TASK.flops(case)
        for name, t in times.items():
            row[f"{name}_us"] = t["us"]
            row[f"{name}_spread"] = t["spread"]
            row[f"{name}_tflops"] = flops / (t["us"] * 1e-6) / 1e12
        row["speedup"] = times["loop"]["us"] / times["two-pass"]["us"]
        rows.append(row)
        if "-mixed-B118-" in case.id:
            breakdowns[case.id] = graph_kernel_breakdown(runners["two-pass"].one)
        print(f"[mixed_prefill] {case.id}: loop {row['loop_us']:.1f} us, two-pass {row['two-pass_us']:.1f} us, "
              f"err ratio {row['err_ratio']:.3f}", flush=True)
        del sets, runners
        torch.cuda.empty_cache()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "cudnn": torch.backends.cudnn.version(), "rows": rows, "two_pass_kernels": breakdowns}
    if os.environ.get("OUT"):
        os.makedirs(os.environ["OUT"], exist_ok=True)
        with open(os.path.join(os.environ["OUT"], "mixed_prefill.json"), "w") as f:
            json.dump(result, f, indent=1)
    for case_id, b in breakdowns.items():
        print(f"\ntwo-pass kernels, {case_id}: replay {b['replay_ms'] * 1e3:.1f} us, kernels {b['kernel_sum_ms'] * 1e3:.1f} us")
        for k in b["top"][:8]:
            print(f"  {k['us']:8.1f} us  x{k['launches']:.0f}  {k['kernel']}")
    print(f"\n{result['device']}, torch {result['torch']}, cuDNN {result['cudnn']}\n")
    cols = [("case", ""), ("loop_us", ".1f"), ("two-pass_us", ".1f"), ("speedup", ".3f"), ("loop_tflops", ".0f"),
            ("two-pass_tflops", ".0f"), ("err_ratio", ".3f"), ("loop_spread", ".3f"), ("two-pass_spread", ".3f")]
    print(md_table([c for c, _ in cols], [[r.get(c) for c, _ in cols] for r in rows], [f for _, f in cols]))


if __name__ == "__main__":
    main()
