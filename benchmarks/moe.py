"""FusedMoE and TopKSoftmax on the H200: the reference's Triton path against the native loop,
torch._grouped_mm and (optionally) torch.compile, at the three MoE models' real shapes, plus a sweep
of the reference's launch configs.

    OUT=out PYTHONPATH=$PWD/src:$PWD python3 -m benchmarks moe [--compile] [--no-sweep]   # GPU, < 3 min
    PYTHONPATH=$PWD/src:$PWD python3 -m benchmarks moe --tiny-cpu                           # CPU check, interpreter

Per model (Mixtral-8x7B, Qwen3-30B-A3B, DeepSeek-V2-Lite; bf16) and token count (decode 1/32/256,
prefill 1024/8192), with the suite's skewed, tie-free router logits (tasks.moe):

* correctness: the Triton path's relative L2 error against native (and, up to 256 tokens, both
  against the float64 truth), routed ids equal; every timed CUDA graph's outputs (first and last call
  of the K-call replay) equal an eager call on the same inputs after timing;
* **GPU time** (the house amortised method, src/fk_pytest/timing.py): each implementation captured in
  a CUDA graph once with 1 call and once with K calls, call j on its own input set (own memory, own
  random routing: the weights (75 MB to 2.8 GB per call) exceed the 50 MB L2 anyway, the rotation
  keeps the activations and routing from repeating), K so a replay lasts >= 100 us; L2 flushed before
  every replay; per call = (K-call - 1-call) / (K - 1), the launch-gap cost of a call inside a decode
  graph included and the replay's fixed cost cancelled. An implementation that cannot be captured
  (the native loop and torch.compile of it read the routing back with .tolist()) is timed eagerly
  and marked so. The eager wall time (triton.testing.do_bench, median, L2 flushed) stays as a second
  column: what a caller without graphs sees, host launch overhead included;
* TB/s against the bytes actually read: the weights of the experts this routing activates (mean over
  the input sets) plus activations in/out, as % of 4.24 TB/s; TFLOP/s (6 T k H I) as % of 741;
* ``--sweep`` (default on; ``--no-sweep`` skips it): candidate decode/prefill launch configs of the
  reference side by side (kernels_reference.ops.moe.kernels.override_configs) at a few cases, the
  small-batch GEMV path (default up to mk.GEMV_MAX_TOKENS tokens) against the grouped GEMMs among them;
* TopKSoftmax's Triton kernel against native (eager wall time).

Prints the markdown tables last; writes $OUT/h200_moe.json when $OUT is set.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
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

from fk_pytest.timing import L2Flusher  # noqa: E402
from fk_pytest.timing import flushed_replay_us  # noqa: E402
from benchmarks.graph_timing import over_sets, time_amortised  # noqa: E402
from kernels_reference.ops.moe import kernels as mk  # noqa: E402
from kernels_reference.L1.fused_moe import FusedMoE  # noqa: E402
from tasks import peers as suite_peers  # noqa: E402
from tasks.moe_inputs import MOE_MODELS, moe_shape, router_logits  # noqa: E402
from tasks.workload import activations  # noqa: E402

PEAK_TFLOPS, COPY_TBPS = 741.0, 4.24
TOKENS = (1, 5, 17) if TINY else (1, 32, 256, 1024, 8192)  # T128 left out: the sweep needs the time
TRUTH_MAX_TOKENS = 256


ROUNDS = 3 if TINY else 15
TARGET_US, MAX_CALLS = 100.0, 64
GC, GV = mk.GemmConfig, mk.GemvConfig
# Decode candidates. "default" is what the module picks itself: the GEMV path up to
# mk.GEMV_MAX_TOKENS tokens, the grouped GEMMs above. The grouped-GEMM candidates force
# path="grouped" (their GemmConfigs are not used on the GEMV path); the GEMV candidates force
# path="gemv" with neighbours of the default launches (mk.GEMV_GATE_UP 16x256 w4 s4, mk.GEMV_DOWN
# 4x256 w4 s6: BLOCK_N x BLOCK_K, warps, stages).
GROUPED = dict(path="grouped")
DECODE_SWEEP = {
    "default": {},
    "grouped path (no gemv)": GROUPED,
    "gemv path": dict(path="gemv"),
    "gemv down 8x256 w4 s6": dict(path="gemv", gemv_down=GV(8, 256, 4, 6)),
    "gemv down 4x256 w4 s3": dict(path="gemv", gemv_down=GV(4, 256, 4, 3)),
    "gemv down 4x512 w4 s4": dict(path="gemv", gemv_down=GV(4, 512, 4, 4)),
    "gemv down 2x256 w2 s8": dict(path="gemv", gemv_down=GV(2, 256, 2, 8)),
    "gemv down 4x256 w4 s6 (the first default)": dict(path="gemv", gemv_down=GV(4, 256, 4, 6)),
    "gemv gate_up 32x256 w4 s4": dict(path="gemv", gemv_gate_up=GV(32, 256, 4, 4)),
    "gemv gate_up 8x512 w4 s4": dict(path="gemv", gemv_gate_up=GV(8, 512, 4, 4)),
    "gemv gate_up 16x256 w4 s6": dict(path="gemv", gemv_gate_up=GV(16, 256, 4, 6)),
    "previous path (torch align, no split-K)": dict(GROUPED, align="torch", gate_up=GC(64, 128, 4, 4),
                                                    down=GC(64, 128, 4, 4)),
    "no split-K (64x128 w4 s4)": dict(GROUPED, gate_up=GC(64, 128, 4, 4), down=GC(64, 128, 4, 4)),
    "down split 2": dict(GROUPED, down=GC(64, 128, 4, 4, split_k=2)),
    "down split 4": dict(GROUPED, down=GC(64, 128, 4, 4, split_k=4)),
    "down split 8": dict(GROUPED, down=GC(64, 128, 4, 4, split_k=8)),
    "32x256 w4 s3, down split 2": dict(GROUPED, gate_up=GC(32, 256, 4, 3), down=GC(32, 256, 4, 3, split_k=2)),
    "32x128 w4 s4, down split 2": dict(GROUPED, gate_up=GC(32, 128, 4, 4), down=GC(32, 128, 4, 4, split_k=2)),
    "128x64 w4 s4, down split 2": dict(GROUPED, gate_up=GC(128, 64, 4, 4), down=GC(128, 64, 4, 4, split_k=2)),
}
# Prefill candidates: the autotuned default against fixed tiles and other row-tile heights.
PREFILL_SWEEP = {
    "default (autotuned)": {},
    "BLOCK_M 128, autotuned": dict(block_m=128),
    "128x128x64 w4 s4 g8": dict(block_m=128, gate_up=GC(128, 64, 4, 4, group_m=8), down=GC(128, 64, 4, 4, group_m=8)),
    "128x256x64 w8 s3 g8": dict(block_m=128, gate_up=GC(256, 64, 8, 3, group_m=8), down=GC(256, 64, 8, 3, group_m=8)),
    "64x128x64 w4 s4 g8": dict(block_m=64, gate_up=GC(128, 64, 4, 4, group_m=8), down=GC(128, 64, 4, 4, group_m=8)),
    "autotuned, torch align": dict(align="torch"),
}
SWEEP_CASES = [("mixtral-8x7b", 1, DECODE_SWEEP), ("qwen3-30b-a3b", 1, DECODE_SWEEP),
               ("deepseek-v2-lite", 1, DECODE_SWEEP), ("qwen3-30b-a3b", 4, DECODE_SWEEP),
               ("qwen3-30b-a3b", 32, DECODE_SWEEP), ("qwen3-30b-a3b", 1024, PREFILL_SWEEP)]
if TINY:  # the interpreter: a few variants only, both decode paths among them
    DECODE_SWEEP = {k: DECODE_SWEEP[k] for k in ("default", "grouped path (no gemv)", "gemv path",
                                                 "gemv down 8x256 w4 s6", "down split 2")}
    PREFILL_SWEEP = {k: PREFILL_SWEEP[k] for k in ("default (autotuned)", "64x128x64 w4 s4 g8")}
    SWEEP_CASES = [("qwen3-30b-a3b", 1, DECODE_SWEEP), ("deepseek-v2-lite", 5, PREFILL_SWEEP)]


def bench_ms(fn) -> float:
    """Eager wall time: what a caller without CUDA graphs sees (host launch overhead included)."""
    if TINY:
        fn()
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")


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


def make_sets(shape, t, count, gen, device):
    """``count`` input sets, each its own memory and its own random tokens and routing."""
    return [{"x": activations((t, shape.hidden_size), gen, device, torch.bfloat16),
             "logits": router_logits(t, shape.num_experts, shape.top_k, gen, device, torch.bfloat16)}
            for _ in range(count)]


def active_experts(m, s) -> int:
    return int(m.topk.forward_native(s["logits"])[1].unique().numel())


def layer_bytes(shape, t, active) -> float:
    """Weights of the activated experts (gate, up, down) + hidden states in and out + logits, bf16."""
    return 2 * (active * 3 * shape.hidden_size * shape.intermediate_size + 2 * t * shape.hidden_size
                + t * shape.num_experts)


# ---- amortised CUDA-graph timing ----------------------------------------------------------------------
def graph_times(impls, sets_for, flush, want_for):
    """impls: name -> (fn, context). Captures and times them together; each timed graph's first and
    last call are then compared with an eager call on the same inputs (exactly equal expected: same
    kernels, same launch configs). Returns name -> dict (us, spread, single_us, calls, replay_rel_err)
    or {"error": ...} for an implementation that could not be captured."""
    first = next(iter(impls.values()))
    probe = sets_for(2)
    single = flushed_replay_us(over_sets(first[0], probe, 1, first[1]).one, flush, tries=3)
    calls = max(2, min(MAX_CALLS, math.ceil(TARGET_US / max(single, 1e-3))))
    sets = probe + sets_for(calls - 2)
    runners, out = {}, {}
    for name, (fn, context) in impls.items():
        try:
            runners[name] = over_sets(fn, sets, calls, context)
        except Exception as exc:  # noqa: BLE001 - not capturable: reported, the others still time
            torch.cuda.synchronize()
            out[name] = {"error": f"not capturable: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"}
    for name, t in time_amortised(runners, flush, ROUNDS).items():
        r = runners[name]
        err = max(rel(r.many_out[0], want_for(name, sets[0])), rel(r.many_out[-1], want_for(name, sets[calls - 1])))
        out[name] = dict(t, replay_rel_err=err)
    del runners, sets
    torch.cuda.empty_cache()
    return out


# ---- the main table ---------------------------------------------------------------------------------
def run_case(m, shape, t, device, gen, flush, use_compile, compiled):
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
    flops = 6 * t * shape.top_k * shape.hidden_size * shape.intermediate_size
    reference = m.forward_triton if TINY else m  # the production path: forward (Triton on CUDA)
    peer = (lambda s: suite_peers.grouped_mm_moe(s["x"], s["logits"], m.w13_weight, m.w2_weight,
                                                 shape.top_k, shape.renormalize))
    fns = {"reference": lambda s: reference(s["x"], s["logits"]), "eager": lambda s: m.forward_native(s["x"], s["logits"])}
    if device.type == "cuda" and hasattr(torch, "_grouped_mm"):
        fns["grouped_mm"] = peer
    if use_compile:
        fns["compile"] = lambda s: compiled(s["x"], s["logits"])
    one = {"x": x, "logits": logits}
    eager_ms = {}
    with torch.no_grad():
        for name, fn in fns.items():
            try:
                eager_ms[name] = bench_ms(lambda: fn(one))
            except Exception as exc:  # noqa: BLE001 - a peer failing must not lose the row
                eager_ms[name] = None
                row[f"{name}_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        if "grouped_mm" in fns and eager_ms.get("grouped_mm") is not None:
            row["grouped_mm_rel_err_vs_native"] = rel(peer(one), native)
        eager_ms["topk_reference"] = bench_ms(lambda: (m.topk.forward_triton if TINY else m.topk)(logits))
        eager_ms["topk_eager"] = bench_ms(lambda: m.topk.forward_native(logits))
    row["eager_ms"] = eager_ms
    if device.type == "cuda":
        # The native loop (and torch.compile of it, graph-broken at the same place) reads the routing
        # back with .tolist(): not capturable by construction; its eager time is its only time.
        # (One capture attempt on it runs at the end of the script, so a failed capture cannot
        # disturb the other cases.)
        graphed = {n: (fns[n], None) for n in ("reference", "grouped_mm") if n in fns and eager_ms.get(n) is not None}
        sets_for = lambda n: make_sets(shape, t, n, gen, device)  # noqa: E731
        with torch.no_grad():
            wants = {}
            want_for = lambda name, s: wants.setdefault((name, id(s)), fns[name](s))  # noqa: E731
            row["graph"] = graph_times(graphed, sets_for, flush, want_for)
            sample = sets_for(4)
            active = sum(active_experts(m, s) for s in sample) / len(sample)
    else:
        row["graph"] = {}
        active = active_experts(m, one)
    nbytes = layer_bytes(shape, t, active)
    row.update(active_experts=active, flops=flops, bytes=nbytes)
    for name, g in row["graph"].items():
        if "us" in g:
            s_ = g["us"] * 1e-6
            g.update(tflops=flops / s_ / 1e12, tbps=nbytes / s_ / 1e12)
            g.update(pct_peak=100 * g["tflops"] / PEAK_TFLOPS, pct_bw=100 * g["tbps"] / COPY_TBPS)
    return row


# ---- the config sweep -----------------------------------------------------------------------------
def sweep_case(model, t, variants, device, flush):
    gen = torch.Generator(device=device).manual_seed(1)
    m, shape = build(model, device, gen)
    sets = make_sets(shape, t, 1, gen, device)
    want = m.forward_native(sets[0]["x"], sets[0]["logits"])
    rows = {}
    for label, override in variants.items():
        context = lambda o=override: mk.override_configs(**o)  # noqa: E731
        row = rows[label] = {"case": f"{model} T{t}", "variant": label,
                             "override": {k: (dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v)
                                          for k, v in override.items()}}
        try:
            with context(), torch.no_grad():
                row["rel_err_vs_native"] = rel(m.forward_triton(sets[0]["x"], sets[0]["logits"]), want)
        except Exception as exc:  # noqa: BLE001 - a variant that fails is recorded, not fatal
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    live = {label: r for label, r in rows.items() if "error" not in r}
    if device.type == "cuda":
        fn = lambda s: m(s["x"], s["logits"])  # noqa: E731
        impls = {label: (fn, (lambda o=variants[label]: mk.override_configs(**o))) for label in live}
        eager = {}

        def want_for(label, s):
            if (label, id(s)) not in eager:
                with mk.override_configs(**variants[label]):
                    eager[(label, id(s))] = fn(s)
            return eager[(label, id(s))]

        with torch.no_grad():
            times = graph_times(impls, lambda n: make_sets(shape, t, n, gen, device), flush, want_for)
            active = sum(active_experts(m, s) for s in make_sets(shape, t, 4, gen, device)) / 4
        nbytes = layer_bytes(shape, t, active)
        for label, tm in times.items():
            rows[label].update(tm)
            if "us" in tm:
                rows[label].update(tbps=nbytes / (tm["us"] * 1e-6) / 1e12)
                rows[label]["pct_bw"] = 100 * rows[label]["tbps"] / COPY_TBPS
    else:
        for label in live:
            with mk.override_configs(**variants[label]), torch.no_grad():
                t0 = time.perf_counter()
                m.forward_triton(sets[0]["x"], sets[0]["logits"])
                rows[label]["us"] = (time.perf_counter() - t0) * 1e6
    base = rows[next(iter(variants))].get("us")
    for r in rows.values():
        r["vs_default"] = base / r["us"] if base and r.get("us") else None
        r["ok"] = "error" not in r and r.get("rel_err_vs_native", 1) < 2e-2 and r.get("replay_rel_err", 0) == 0
    del m
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return list(rows.values())


def capture_probe(device):
    """One attempt to capture the native loop in a CUDA graph (expected to fail: it syncs)."""
    if device.type != "cuda":
        return {"native_capturable": None}
    m = FusedMoE(8, 2, 64, 32).to(device).bfloat16()
    x, logits = torch.randn(4, 64, device=device).bfloat16(), torch.randn(4, 8, device=device).bfloat16()
    try:
        with torch.no_grad():
            m.forward_native(x, logits)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                m.forward_native(x, logits)
        return {"native_capturable": True}
    except Exception as exc:  # noqa: BLE001
        try:
            torch.cuda.synchronize()
        except Exception:  # noqa: BLE001 - the probe runs last; a broken context loses nothing
            pass
        return {"native_capturable": False, "why": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny-cpu", action="store_true")
    ap.add_argument("--compile", action="store_true", help="also time torch.compile(forward_native) (eager)")
    ap.add_argument("--no-sweep", action="store_true", help="skip the launch-config sweep")
    ap.add_argument("--models", default=",".join(MOE_MODELS))
    args = ap.parse_args()
    device = torch.device("cpu" if TINY else "cuda")
    torch._dynamo.config.recompile_limit = 256
    result = {"env": {"torch": torch.__version__, "triton": triton.__version__,
                      "gpu": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (interpreter)"},
              "rows": [], "sweep": []}
    flush = L2Flusher(device) if device.type == "cuda" else None
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
                row = run_case(m, shape, t, device, gen, flush, args.compile, compiled)
            except Exception:  # noqa: BLE001 - one case failing must not lose the others
                row = {"tokens": t, "error": traceback.format_exc()[-2000:]}
            row.update(model=model, seconds=round(time.time() - t0, 2))
            result["rows"].append(row)
            print(f"{model} T{t}: graph us {({k: round(v.get('us', -1), 1) for k, v in row.get('graph', {}).items()})}"
                  f" eager ms {row.get('eager_ms', row.get('error', ''))} ({row['seconds']}s)", flush=True)
        del m, compiled
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if not args.no_sweep:
        for model, t, variants in SWEEP_CASES:
            t0 = time.time()
            try:
                result["sweep"] += sweep_case(model, t, variants, device, flush)
            except Exception:  # noqa: BLE001
                result["sweep"].append({"case": f"{model} T{t}", "variant": "-", "error": traceback.format_exc()[-2000:]})
            print(f"sweep {model} T{t}: {time.time() - t0:.1f}s", flush=True)
    try:
        result["env"].update(capture_probe(device))
    except Exception as exc:  # noqa: BLE001
        result["env"]["native_capturable"] = f"probe failed: {exc!r}"[:200]
    result["seconds"] = round(time.time() - started, 1)
    out = os.environ.get("OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "h200_moe.json"), "w") as f:
            json.dump(result, f, indent=1, default=str)
    print_tables(result)


def f(v, p=3):
    return "-" if v is None else f"{v:.{p}g}" if isinstance(v, float) else str(v)


def print_tables(result):
    print(f"\n{result['env']} total {result['seconds']}s")
    if result["sweep"]:
        print("\n## Launch-config sweep of the reference (amortised CUDA-graph us per call; vs default > 1 = faster)\n")
        print("| case | variant | us | vs default | TB/s (% 4.24) | K | spread | check |")
        print("|---|---|---|---|---|---|---|---|")
        for r in result["sweep"]:
            bw = f"{r['tbps']:.2f} ({r['pct_bw']:.0f}%)" if "tbps" in r else "-"
            check = "ok" if r.get("ok") else (r.get("error") or "FAILED")[:60]
            print(f"| {r['case']} | {r['variant']} | {f(r.get('us'))} | {f(r.get('vs_default'))} | {bw} "
                  f"| {r.get('calls', '-')} | {f(r.get('spread'), 2)} | {check} |")
    native_note = {True: "capturable?!", False: "not capturable (syncs)", None: "-"}.get(
        result["env"].get("native_capturable"), str(result["env"].get("native_capturable")))
    print(f"\n## FusedMoE: GPU us per call in CUDA graphs (amortised) | eager wall us; native loop: {native_note}\n")
    print("| model | T | act. experts | ids | err tri/nat vs f64 | ref graph us | ref eager us | gmm graph us "
          "| gmm eager us | native eager us | compile eager us | ref TB/s (% 4.24) | ref TFLOP/s (% 741) "
          "| ref vs gmm (graph) | K | replay err | topk ref/eager us |")
    print("|" + "---|" * 17)
    for r in result["rows"]:
        if "error" in r:
            print(f"| {r['model']} | {r.get('tokens', '-')} | ERROR {r['error'].strip().splitlines()[-1][:80]} |")
            continue
        e, g = r["eager_ms"], r["graph"]
        us = lambda ms: None if ms is None else ms * 1e3  # noqa: E731
        gus = lambda n: (g[n].get("us") if n in g else None)  # noqa: E731
        gcell = lambda n: f(gus(n)) if n not in g or "us" in g[n] else "not capturable"  # noqa: E731
        truth = (f"{f(r.get('err_triton_vs_f64'))}/{f(r.get('err_native_vs_f64'))}" if "err_triton_vs_f64" in r else "-")
        ref = g.get("reference", {})
        bw = f"{ref['tbps']:.2f} ({ref['pct_bw']:.0f}%)" if "tbps" in ref else "-"
        fl = f"{ref['tflops']:.1f} ({ref['pct_peak']:.0f}%)" if "tflops" in ref else "-"
        ratio = gus("grouped_mm") / gus("reference") if gus("grouped_mm") and gus("reference") else None
        replay = ref.get("replay_rel_err")  # 0 expected: the same kernels and configs as an eager call
        print(f"| {r['model']} | {r['tokens']} | {f(r['active_experts'])} | {r['ids_equal']} | {truth} "
              f"| {gcell('reference')} | {f(us(e.get('reference')))} | {gcell('grouped_mm')} "
              f"| {f(us(e.get('grouped_mm')))} | {f(us(e.get('eager')))} | {f(us(e.get('compile')))} | {bw} | {fl} "
              f"| {f(ratio)} | {ref.get('calls', '-')} | {f(replay)} "
              f"| {f(us(e['topk_reference']))}/{f(us(e['topk_eager']))} |")


if __name__ == "__main__":
    main()
