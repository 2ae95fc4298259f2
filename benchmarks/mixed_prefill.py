"""The attention task's prefill and mixed batches on one GPU: cuDNN's two-pass prefill against the
SDPA call per sequence it replaced, side by side on the task's own inputs.

    python3 -m benchmarks mixed_prefill              # H100 / H200, about a minute
    python3 -m benchmarks mixed_prefill --cases B118 # only case ids containing B118

For every full-profile case of tasks/L1/test_attention.py that is not a pure decode (Llama-3.1-8B,
32/8 heads, and Qwen2.5-7B, 28/4; the captured mixed batches B33 and B118 and the B8 x 1024
prefill):

1. each path's error against the float64 truth (``forward_native``); ``err_ratio`` is a path's
   error over the loop's, the suite's own measure (fk_pytest.compare.output_error). Paths: the
   SDPA call per sequence (``loop``), the two passes on cuDNN (``two-pass``), pass 1 in one
   FlashAttention-2 varlen launch instead (``two-pass-fa2``), each forced on every case (what
   ships: the two passes only on a step with a long continuing chunk, ``fast.two_pass_applies``);
2. GPU time, amortised CUDA-graph replays (benchmarks/graph_timing.py) over several input sets,
   the paths interleaved, L2 flushed before every replay; TFLOP/s from the task's own flop count.
   Where flash-attn-4 is importable, FlashAttention 4 on the same paged cache (the peer benchmark's
   ``flash-attn-4`` peer, tasks/peers.py) is a path too, and ``fa4_over_PATH`` is its time over
   the path's (the peer table's ratio: above 1, the path is faster);
3. for the largest mixed batch of each model, where the two-pass path's time goes (kernels of
   its graph under the profiler).

Writes $OUT/mixed_prefill.json when OUT is set; prints the table last.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "src")]

import torch  # noqa: E402

from benchmarks.graph_timing import graph_kernel_breakdown, over_sets, time_amortised  # noqa: E402
from benchmarks.markdown import md_table  # noqa: E402
from fk_pytest.compare import output_error  # noqa: E402
from kernels_reference.L1.attention import Attention  # noqa: E402
from kernels_reference.ops.attention import fast, two_pass_prefill  # noqa: E402
from tasks.L1.test_attention import TASK  # noqa: E402

MODELS = ("llama-3.1-8b", "qwen2.5-7b")
SETS = 4  # input sets per case: K of the amortised graph
ROUNDS = 15
# path -> the two-pass kernels (None: the SDPA call per sequence)
PATHS = {"loop": None, "two-pass": two_pass_prefill.CUDNN_PARTIALS,
         "two-pass-fa2": two_pass_prefill.FLASH_VARLEN_PARTIALS}


@contextlib.contextmanager
def prefill_path(name: str):
    """Every step of the case on path ``name``, whatever the shipped choice of steps
    (``fast.two_pass_applies``) would take: the table compares the paths on every case."""
    saved = fast.two_pass_applies, fast.TWO_PASS_PARTIALS
    forced = PATHS[name] is not None
    fast.two_pass_applies = lambda query_lens, seq_lens: forced
    fast.TWO_PASS_PARTIALS = PATHS[name] or saved[1]
    try:
        yield
    finally:
        fast.two_pass_applies, fast.TWO_PASS_PARTIALS = saved


def cases(only: str):
    return [c for c in TASK.cases("full") if c.model in MODELS and "-decode-" not in c.id and only in c.id]


def inputs(case, seed: int, device, dtype=None):
    gen = torch.Generator(device=device).manual_seed(seed)
    made = TASK.make_inputs(case, gen, device)
    if dtype is not None:
        made = {k: (v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() else v) for k, v in made.items()}
    return made


def fa4_layer(case, module, device):
    """FlashAttention 4 on the task's own paged cache, exactly as the peer benchmark runs it
    (tasks/peers.py), or None where flash-attn-4 is not installed."""
    from fk_pytest.peers.contract import PeerContext, PeerNotRun
    from tasks.peers import _flash_attn_4
    try:
        return _flash_attn_4(PeerContext(TASK, case, module, {}, device, False))
    except PeerNotRun:
        return None


def path_calls(case, module, device) -> dict:
    """name -> (call on an input set, the context it runs in): the paths, plus FA4 where installed."""
    calls = {name: (functools.partial(TASK.call, module), functools.partial(prefill_path, name)) for name in PATHS}
    fa4 = fa4_layer(case, module, device)
    if fa4 is not None:
        calls["fa4"] = (fa4, contextlib.nullcontext)
    return calls


def check(case, module, calls, device) -> dict:
    """Each path's output on a copy of one input set, against the float64 truth; a path that
    raises is recorded and left out of the timing."""
    base = inputs(case, 0, device)
    truth_inputs = {k: (v.double() if torch.is_tensor(v) and v.is_floating_point() else v) for k, v in base.items()}
    with torch.no_grad():
        truth = TASK.call(module, truth_inputs, method="forward_native").clone()
        del truth_inputs
        outs, row = {}, {}
        for name, (call, context) in calls.items():
            run = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in base.items()}
            try:
                with context(), warnings.catch_warnings():
                    # a refused two-pass falls back to the loop with this warning: count the path as failed
                    warnings.filterwarnings("error", message="cuDNN two-pass prefill refused")
                    outs[name] = call(run).clone()
            except Exception as exc:  # noqa: BLE001 - this path refuses these inputs: recorded
                row[f"{name}_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            finally:
                fast._TWO_PASS_REFUSED.clear()
    for name, out in outs.items():
        err = output_error("out", truth, [outs["loop"]], out, case.dtype)
        row[f"{name}_err"] = err.e_cand
        row[f"{name}_err_ratio"] = err.ratio
    return row, list(outs)


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
        calls = path_calls(case, module, device)
        checked, ran = check(case, module, calls, device)
        row = {"case": case.id, "weight": case.weight, **checked}
        sets = [inputs(case, seed, device) for seed in range(SETS)]
        runners = {name: over_sets(calls[name][0], sets, SETS, context=calls[name][1]) for name in ran}
        times = time_amortised(runners, flush, ROUNDS)
        flops = TASK.flops(case)
        for name, t in times.items():
            row[f"{name}_us"] = t["us"]
            row[f"{name}_spread"] = t["spread"]
            row[f"{name}_tflops"] = flops / (t["us"] * 1e-6) / 1e12
        for name in ran[1:]:
            row[f"{name}_speedup"] = times["loop"]["us"] / times[name]["us"]
        if "fa4" in times:  # the peer table's ratio: FA4's time over the path's (> 1: the path is faster)
            for name in ran:
                row[f"fa4_over_{name}"] = times["fa4"]["us"] / times[name]["us"]
        rows.append(row)
        if "-mixed-B118-" in case.id and "two-pass" in runners:
            breakdowns[case.id] = graph_kernel_breakdown(runners["two-pass"].one)
        print(f"[mixed_prefill] {case.id}: " + ", ".join(f"{n} {row[n + '_us']:.1f} us (err x{row[n + '_err_ratio']:.3f})"
                                                       for n in ran), flush=True)
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
    cols = [("case", ""), ("loop_us", ".1f"), ("two-pass_us", ".1f"), ("two-pass-fa2_us", ".1f"), ("fa4_us", ".1f"),
            ("two-pass_speedup", ".3f"), ("two-pass-fa2_speedup", ".3f"), ("fa4_over_loop", ".3f"),
            ("fa4_over_two-pass", ".3f"), ("fa4_over_two-pass-fa2", ".3f"), ("two-pass_tflops", ".0f"),
            ("two-pass_err_ratio", ".3f"), ("two-pass-fa2_err_ratio", ".3f"), ("fa4_err_ratio", ".3f"),
            ("two-pass_spread", ".3f")]
    print(md_table([c for c, _ in cols], [[r.get(c) for c, _ in cols] for r in rows], [f for _, f in cols]))
    for r in rows:
        for k, v in r.items():
            if k.endswith("_error"):
                print(f"{r['case']}: {k[:-6]} failed: {v}")


if __name__ == "__main__":
    main()
