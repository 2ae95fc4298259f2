"""FusedMoE and TopKSoftmax on the H200: the reference's Triton path against the native loop,
torch._grouped_mm and (optionally) torch.compile, at the three MoE models' real shapes.

    OUT=out PYTHONPATH=$PWD/src:$PWD python3 tools/h200_moe.py [--compile]    # GPU, ~2 min
    PYTHONPATH=$PWD/src:$PWD python3 tools/h200_moe.py --tiny-cpu               # CPU check, interpreter

Per model (Mixtral-8x7B, Qwen3-30B-A3B, DeepSeek-V2-Lite; bf16) and token count (decode 1/32/128/256,
prefill 1024/8192), with the suite's skewed, tie-free router logits (tasks.moe):

* correctness: the Triton path's relative L2 error against native (and, up to 256 tokens, both
  against the float64 truth), routed ids equal;
* a CUDA-graph capture and replay of the Triton path at decode sizes (fails if anything syncs);
* time (triton.testing.do_bench, median, L2 flushed between runs) of the reference's Triton path,
  eager forward_native, the torch._grouped_mm layer (tasks.peers.grouped_mm_moe) and with
  --compile torch.compile(forward_native); TFLOP/s and TB/s of the reference with % of 741 TFLOP/s
  (bf16 dense GEMM measured) and 4.24 TB/s (copy) — bytes = weights of the experts this routing
  activates + activations in and out;
* TopKSoftmax's Triton kernel against native.

Prints a markdown table last; writes $OUT/h200_moe.json when $OUT is set.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "src")]
TINY = "--tiny-cpu" in sys.argv
if TINY:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch  # noqa: E402
import triton  # noqa: E402

from kernels_reference.L1.fused_moe import FusedMoE  # noqa: E402
from kernels_reference.L1.topk_softmax import TopKSoftmax  # noqa: E402
from tasks import peers as suite_peers  # noqa: E402
from tasks.moe_inputs import MOE_MODELS, moe_shape, router_logits  # noqa: E402
from tasks.workload import activations  # noqa: E402

PEAK_TFLOPS, COPY_TBPS = 741.0, 4.24
TOKENS = (1, 5, 17) if TINY else (1, 32, 128, 256, 1024, 8192)
TRUTH_MAX_TOKENS = 256


def bench_ms(fn) -> float:
    if TINY:
        fn()
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def build(model, device, gen):
    shape = moe_shape(model, "cpu" if TINY else "full")
    m = FusedMoE(**shape.init_args()).to(device)
    with torch.no_grad():
        for p in (m.w13_weight, m.w2_weight):
            p.copy_(torch.randn(p.shape, generator=gen, device=device) * p.shape[-1] ** -0.5)
    return m.to(torch.bfloat16), shape


def graph_check(m, x, logits):
    """Capture the Triton path in a CUDA graph and replay it on new inputs: a host sync would fail
    the capture; a result baked in at capture time would differ on replay."""
    static_x, static_l = x.clone(), logits.clone()
    with torch.no_grad():
        m(static_x, static_l)  # warm-up (compiles) outside capture
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_out = m(static_x, static_l)
        static_x.copy_(x.flip(0))
        static_l.copy_(logits.flip(0))
        g.replay()
        torch.cuda.synchronize()
        return rel(static_out, m(x.flip(0), logits.flip(0)))


def run_case(m, shape, t, device, gen, use_compile, compiled):
    row = {"tokens": t}
    x = activations((t, shape.hidden_size), gen, device, torch.bfloat16)
    logits = router_logits(t, shape.num_experts, shape.top_k, gen, device, torch.bfloat16)
    with torch.no_grad():
        fast, native = m.forward_triton(x, logits), m.forward_native(x, logits)
        ids_fast, ids_native = m.topk.forward_triton(logits)[1], m.topk.forward_native(logits)[1]
        row["ids_equal"] = bool(torch.equal(ids_fast, ids_native))
        row["rel_err_vs_native"] = rel(fast, native)
        if t <= TRUTH_MAX_TOKENS:
            m64 = FusedMoE(**shape.init_args()).to(device).double()
            m64.load_state_dict(m.state_dict())
            truth = m64.forward_native(x.double(), logits.double())
            row["err_triton_vs_f64"], row["err_native_vs_f64"] = rel(fast, truth), rel(native, truth)
            del m64
        if device.type == "cuda" and t <= 256:
            row["graph_replay_rel_err"] = graph_check(m, x, logits)
        active = int(ids_native.unique().numel())
    flops = 6 * t * shape.top_k * shape.hidden_size * shape.intermediate_size
    nbytes = 2 * (active * 3 * shape.hidden_size * shape.intermediate_size + 2 * t * shape.hidden_size
                  + t * shape.num_experts)
    row.update(active_experts=active, flops=flops, bytes=nbytes)
    # the reference's production path: forward (Triton on CUDA); interpreted forward_triton on the CPU
    reference = m.forward_triton if TINY else m
    impls = {"reference": lambda: reference(x, logits), "eager": lambda: m.forward_native(x, logits)}
    if device.type == "cuda" and hasattr(torch, "_grouped_mm"):
        impls["grouped_mm"] = lambda: suite_peers.grouped_mm_moe(x, logits, m.w13_weight, m.w2_weight,
                                                                 shape.top_k, shape.renormalize)
    if use_compile:
        impls["compile"] = lambda: compiled(x, logits)
    times = {}
    with torch.no_grad():
        for name, fn in impls.items():
            try:
                times[name] = bench_ms(fn)
            except Exception as exc:  # noqa: BLE001 - a peer failing must not lose the row
                times[name] = None
                row[f"{name}_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        if "grouped_mm" in impls and times.get("grouped_mm") is not None:
            row["grouped_mm_rel_err_vs_native"] = rel(impls["grouped_mm"](), native)
        topk = m.topk
        topk_ref = topk.forward_triton if TINY else topk
        times["topk_reference"] = bench_ms(lambda: topk_ref(logits))
        times["topk_eager"] = bench_ms(lambda: topk.forward_native(logits))
    row["ms"] = times
    ref_s = times["reference"] / 1e3
    row["ref_tflops"], row["ref_tbps"] = flops / ref_s / 1e12, nbytes / ref_s / 1e12
    row["ref_pct_peak"], row["ref_pct_bw"] = 100 * row["ref_tflops"] / PEAK_TFLOPS, 100 * row["ref_tbps"] / COPY_TBPS
    peers = {k: v for k, v in times.items() if k in ("eager", "grouped_mm", "compile") and v}
    row["best_peer"] = min(peers, key=peers.get) if peers else None
    row["speedup_vs_best_peer"] = peers[row["best_peer"]] / times["reference"] if peers else None
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny-cpu", action="store_true")
    ap.add_argument("--compile", action="store_true", help="also time torch.compile(forward_native)")
    ap.add_argument("--models", default=",".join(MOE_MODELS))
    args = ap.parse_args()
    device = torch.device("cpu" if TINY else "cuda")
    torch._dynamo.config.recompile_limit = 256
    result = {"env": {"torch": torch.__version__, "triton": triton.__version__,
                      "gpu": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (interpreter)"},
              "rows": []}
    started = time.time()
    for model in args.models.split(","):
        gen = torch.Generator(device=device).manual_seed(0)
        try:
            m, shape = build(model, device, gen)
        except Exception:  # noqa: BLE001
            result["rows"].append({"model": model, "error": traceback.format_exc()[-2000:]})
            continue
        compiled = torch.compile(m.forward_native, dynamic=False) if args.compile else None
        for t in TOKENS:
            t0 = time.time()
            try:
                row = run_case(m, shape, t, device, gen, args.compile, compiled)
            except Exception:  # noqa: BLE001 - one case failing must not lose the others
                row = {"tokens": t, "error": traceback.format_exc()[-2000:]}
            row.update(model=model, seconds=round(time.time() - t0, 2))
            result["rows"].append(row)
            print(f"{model} T{t}: {row.get('ms', row.get('error', ''))} ({row['seconds']}s)", flush=True)
        del m
        if device.type == "cuda":
            torch.cuda.empty_cache()
    result["seconds"] = round(time.time() - started, 1)
    out = os.environ.get("OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "h200_moe.json"), "w") as f:
            json.dump(result, f, indent=1, default=str)
    print_table(result)


def print_table(result):
    f = lambda v, p=3: "-" if v is None else f"{v:.{p}g}" if isinstance(v, float) else str(v)  # noqa: E731
    print(f"\n{result['env']} total {result['seconds']}s\n")
    print("| model | T | ids | err vs native | err tri/nat vs f64 | graph | ref ms | eager ms | grouped_mm ms "
          "| compile ms | TFLOP/s (% 741) | TB/s (% 4.24) | vs best peer | topk ref/eager ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in result["rows"]:
        if "error" in r:
            print(f"| {r['model']} | {r.get('tokens', '-')} | ERROR {r['error'].strip().splitlines()[-1][:80]} |")
            continue
        ms = r["ms"]
        truth = (f"{f(r.get('err_triton_vs_f64'))}/{f(r.get('err_native_vs_f64'))}"
                 if "err_triton_vs_f64" in r else "-")
        print(f"| {r['model']} | {r['tokens']} | {r['ids_equal']} | {f(r['rel_err_vs_native'])} | {truth} "
              f"| {f(r.get('graph_replay_rel_err'))} | {f(ms['reference'])} | {f(ms.get('eager'))} "
              f"| {f(ms.get('grouped_mm'))} | {f(ms.get('compile'))} "
              f"| {r['ref_tflops']:.1f} ({r['ref_pct_peak']:.0f}%) | {r['ref_tbps']:.2f} ({r['ref_pct_bw']:.0f}%) "
              f"| {f(r['speedup_vs_best_peer'])} {r['best_peer']} | {f(ms['topk_reference'])}/{f(ms['topk_eager'])} |")


if __name__ == "__main__":
    main()
