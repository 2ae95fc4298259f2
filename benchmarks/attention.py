"""Attention fast path on a GPU in one go: correctness checks, then timings and knob sweeps.

    python3 -m benchmarks attention                 # on the H200, from the repo root (about 1-2 minutes)
    python3 -m benchmarks attention --cpu-smoke     # tiny shapes, Triton interpreter, CPU wall times

1. Checks (float32, and bfloat16 calibrated against a float64 truth): decode (with splits and a
   padded row), prefill, chunked prefill, a mixed batch; decode replayed from a CUDA graph after the
   metadata contents changed; one decode step under torch.compile(fullgraph=True).
2. Roofline: the suite's own ``fk_pytest.timing.measure_roofline`` copy bandwidth (so every "frac"
   below agrees with the suite's reports), and the timing floor: a CUDA graph of one trivial kernel
   timed exactly like the kernels (L2 flush, events around a replay). A kernel's time includes that
   floor, so decode reports both ``frac`` = bytes / t / copy and ``frac_kernel`` = bytes /
   (t - floor) / copy: the part of the gap that is method overhead rather than the kernel.
3. KV store at 16384 / 65536 tokens; paged decode (32/8 heads, d=128, block 16, shuffled blocks) at
   B1 C8192, B32 C2048, B64 C4096, B128 C1024, B256 C512: the default DecodeConfig, the previous
   default, and a sweep of the knobs (fused merge included). Configs that launch the same kernel
   with the same split count for a shape are timed once. A variant that fails is recorded, not fatal.
4. SDPA prefill backends (forced one at a time; GQA via enable_gqa or expanded K/V) at T=2048/8192/
   16384, a varlen batch of 4 sequences, and a chunk over cached context (bottom-right causal).

Times: CUDA-graph replays where capturable, L2 flushed before each call, median of the rounds.
Writes $OUT/attention.json when OUT is set; prints the tables last.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import math
import os
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "src")]

NQ, NK, HD, BLOCK = 32, 8, 128, 16  # Llama-3.1-8B / Qwen3-8B attention
DECODE_SHAPES = [(1, 8192), (32, 2048), (64, 4096), (128, 1024), (256, 512)]
STORE_TOKENS = [16384, 65536]
PREFILL_TOKENS = [2048, 8192, 16384]
VARLEN = [700, 129, 1024, 33]
CHUNK = (3072, 1024)  # (cached context, new tokens)
SWEEP = {"blocks_per_iter": [2, 4, 8], "num_warps": [4, 8], "programs_per_sm": [1, 2, 4],
         "small_batch_programs_per_sm": [4, 8], "max_splits": [64, 128], "fused_merge": [False, True]}
EXTRA_DECODE = [{"num_stages": 1}, {"num_stages": 3}, {"fused_merge": True}]  # changes to the default
PREVIOUS_DEFAULT = {"kernel": "two-pass", "blocks_per_iter": 4, "num_warps": 4, "num_stages": 2, "programs_per_sm": 4,
                    "small_batch_programs_per_sm": 4, "max_splits": 64, "fused_merge": False}
STORE_WARPS = [2, 4, 8]
PREFILL_VARIANTS = [  # (name, forced backend or None for torch's choice, expand K/V)
    ("auto+gqa", None, False), ("cudnn+gqa", "cudnn", False), ("cudnn+expand", "cudnn", True),
    ("flash+gqa", "flash", False), ("efficient+gqa", "efficient", False), ("efficient+expand", "efficient", True),
]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on the CPU (Triton interpreter)")
    p.add_argument("--no-sweep", action="store_true", help="time the default decode config only")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile check")
    return p.parse_args()


ARGS = parse_args()
if ARGS.cpu_smoke:
    os.environ["TRITON_INTERPRET"] = "1"  # before any Triton kernel is defined

import torch  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from fk_pytest.compare import output_error  # noqa: E402
from kernels_reference.ops.paged_decode import config as pd_config  # noqa: E402
from kernels_reference.ops.paged_decode import decode as pd_decode  # noqa: E402
from kernels_reference.ops.paged_decode import device as pd_device  # noqa: E402
from kernels_reference.ops.launch_counters import counters_left_zero  # noqa: E402
from benchmarks.graph_timing import Timer  # noqa: E402
from kernels_reference.L1.attention import Attention  # noqa: E402
from kernels_reference.ops.kv_store.store import store_kv_cache_triton  # noqa: E402
from kernels_reference.ops.attention.sdpa_prefill import PrefillConfig, sdpa_causal  # noqa: E402
from kernels_reference.forward_context import AttentionMetadata, set_forward_context  # noqa: E402

DEVICE = torch.device("cpu" if ARGS.cpu_smoke else "cuda")
if ARGS.cpu_smoke:  # tiny stand-ins for every shape above
    NQ, NK, HD = 8, 2, 32
    DECODE_SHAPES = [(1, 200), (3, 40)]
    STORE_TOKENS = [64]
    PREFILL_TOKENS = [48]
    VARLEN = [20, 3, 9]
    CHUNK = (40, 12)
    SWEEP = {"blocks_per_iter": [1, 2], "num_warps": [4], "programs_per_sm": [2], "small_batch_programs_per_sm": [4],
             "max_splits": [64], "fused_merge": [False, True]}
    STORE_WARPS = [4]
BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


# ---- timing ---------------------------------------------------------------------------------------

def copy_bandwidth_tbps(timer: Timer) -> float:
    """The suite's roofline on a GPU; on the CPU smoke run, a stand-in copy so the tables fill."""
    if timer.cuda:
        from fk_pytest.timing import measure_roofline
        return measure_roofline(DEVICE)["copy_tbps"]
    src = torch.empty(1 << 20, dtype=torch.int8, device=DEVICE).random_()
    dst = torch.empty_like(src)
    return 2 * src.numel() / (timer(lambda: dst.copy_(src))["us"] * 1e-6) / 1e12


def timing_floor_us(timer: Timer) -> float:
    """What the method alone costs: one trivial kernel, captured and timed like every kernel here."""
    tiny = torch.zeros(1, device=DEVICE)
    return timer(lambda: tiny.add_(1.0))["us"]


# ---- inputs ---------------------------------------------------------------------------------------

def gen(seed):
    return torch.Generator(device=DEVICE).manual_seed(seed)


def shuffled_tables(seq_lens, g, spare=2):
    need = [-(-n // BLOCK) for n in seq_lens]
    order = torch.randperm(sum(need) + spare, generator=g, device=DEVICE).tolist()
    tables, at = [], 0
    for n in need:
        tables.append(order[at: at + n])
        at += n
    return tables, len(order)


def step_inputs(context, query, dtype, seed=0, nq=NQ, nk=NK, hd=HD):
    g = gen(seed)
    tables, blocks = shuffled_tables([c + q for c, q in zip(context, query)], g)
    meta = AttentionMetadata.build(context, query, BLOCK, device=DEVICE, block_tables=tables)
    t = sum(query)
    qkv = torch.randn(t, (nq + 2 * nk) * hd, generator=g, device=DEVICE).to(dtype)
    q, k, v = qkv[:, : nq * hd], qkv[:, nq * hd: (nq + nk) * hd], qkv[:, (nq + nk) * hd:]
    caches = tuple(torch.randn(blocks, BLOCK, nk, hd, generator=g, device=DEVICE).to(dtype) for _ in "kv")
    return meta, (q, k, v), caches


def run_layer(layer, meta, qkv, caches, method, upcast=False):
    conv = (lambda x: x.double()) if upcast else (lambda x: x)
    layer.kv_cache = tuple(conv(c.clone()) for c in caches)
    with set_forward_context(meta), torch.no_grad():
        out = getattr(layer, method)(*(conv(x) for x in qkv))
    return out, layer.kv_cache


# ---- 1. checks --------------------------------------------------------------------------------------

CHECK_BATCHES = {
    "decode": ([1000, 37, 300, 5], [1, 1, 1, 1]),
    "prefill": ([0, 0], [300, 45]),
    "chunked": ([200], [77]),
    "mixed": ([0, 150, 61, 999], [40, 20, 1, 1]),
}
if ARGS.cpu_smoke:
    CHECK_BATCHES = {"decode": ([40, 3], [1, 1]), "prefill": ([0], [9]), "chunked": ([21], [6]),
                     "mixed": ([0, 30], [5, 1])}


def check_batch(name, context, query):
    rows = []
    layer = Attention(NQ, HD, HD ** -0.5, NK)
    for dtype in (torch.float32, torch.bfloat16):
        meta, qkv, caches = step_inputs(context, query, dtype)
        truth, truth_caches = run_layer(layer, meta, qkv, caches, "forward_native", upcast=True)
        native, native_caches = run_layer(layer, meta, qkv, caches, "forward_native")
        fast, fast_caches = run_layer(layer, meta, qkv, caches, "forward_fast")
        err = output_error("out", truth, [native], fast, dtype, truncating=ARGS.cpu_smoke)
        ok = err.passed(2.0) and all(torch.equal(a, b) for a, b in zip(fast_caches, native_caches))
        rows.append({"check": f"{name}-{str(dtype)[6:]}", "ok": bool(ok),
                     "max_abs_fast_vs_native": float((fast.double() - native.double()).abs().max()),
                     "rel_err_fast": err.e_cand, "rel_err_native": err.e_ref, "ratio": err.ratio})
    return rows


def check_padded_graph_replay():
    """Decode captured once, replayed after seq_lens / block tables / slots changed in place;
    a padded row (seq_len 0, slot -1) stays zero."""
    layer = Attention(NQ, HD, HD ** -0.5, NK)
    dtype = torch.float32
    steps = ([500, 37, 250], [900, 3, 64]) if DEVICE.type == "cuda" else ([40, 7, 25], [60, 3, 16])
    metas, inputs = [], []
    for seed, ctx in enumerate(steps):
        meta, qkv, caches = step_inputs(ctx, [1] * len(ctx), dtype, seed=seed)
        metas.append(meta)
        inputs.append((qkv, caches))
    width = max(m.block_tables.shape[1] for m in metas)
    blocks = max(c[0].shape[0] for _, c in inputs)

    def padded(meta):  # one padded row at the end; tables padded to a common width
        bt = torch.zeros(meta.num_seqs + 1, width, dtype=torch.int32, device=DEVICE)
        bt[: meta.num_seqs, : meta.block_tables.shape[1]] = meta.block_tables
        return AttentionMetadata(
            torch.arange(meta.num_seqs + 2, dtype=torch.int32, device=DEVICE),
            torch.cat([meta.seq_lens, meta.seq_lens.new_zeros(1)]), bt,
            torch.cat([meta.slot_mapping, meta.slot_mapping.new_full((1,), -1)]), BLOCK, 1, meta.max_seq_len,
            meta.query_lens_cpu + (1,), meta.seq_lens_cpu + (0,))

    def grow(x, rows):  # caches to a common block count; q/k/v with the padded token
        return torch.cat([x, x.new_zeros((rows - x.shape[0],) + x.shape[1:])])

    live_meta = padded(metas[0])
    live_qkv = [grow(x.contiguous(), metas[0].num_seqs + 1) for x in inputs[0][0]]
    live_caches = tuple(grow(c, blocks) for c in inputs[0][1])
    layer.kv_cache = live_caches
    if DEVICE.type == "cuda":
        with set_forward_context(live_meta), torch.no_grad():
            layer(*live_qkv)  # warm-up (compiles the kernels) outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with set_forward_context(live_meta), torch.no_grad(), torch.cuda.graph(graph):
            graph_out = layer(*live_qkv)
    new_meta = padded(metas[1])
    for name in ("seq_lens", "block_tables", "slot_mapping"):
        getattr(live_meta, name).copy_(getattr(new_meta, name))
    for dst, src in zip(live_qkv, inputs[1][0]):
        dst[: src.shape[0]].copy_(src)
    new_caches = tuple(grow(c, blocks) for c in inputs[1][1])
    for dst, src in zip(live_caches, new_caches):
        dst.copy_(src)
    if DEVICE.type == "cuda":
        graph.replay()
        torch.cuda.synchronize()
        got = graph_out.clone()
    else:
        with set_forward_context(new_meta), torch.no_grad():
            got = layer.forward_fast(*live_qkv)
    want, _ = run_layer(Attention(NQ, HD, HD ** -0.5, NK), new_meta, live_qkv, new_caches, "forward_native")
    err = float((got - want).abs().max())
    ok = err < 1e-4 and torch.count_nonzero(got[-1]) == 0 and bool(torch.isfinite(got).all())
    return {"check": "decode-graph-replay-new-metadata+padded-row", "ok": bool(ok), "max_abs_fast_vs_native": err}


def check_compile():
    torch._dynamo.reset()
    layer = Attention(NQ, HD, HD ** -0.5, NK)
    compiled = torch.compile(layer, fullgraph=True)
    worst = 0.0
    for seed, ctx in enumerate(([100, 37, 250], [101, 38, 251])):
        meta, qkv, caches = step_inputs(ctx, [1, 1, 1], torch.float32, seed=seed)
        want, want_caches = run_layer(Attention(NQ, HD, HD ** -0.5, NK), meta, qkv, caches, "forward_native")
        layer.kv_cache = tuple(c.clone() for c in caches)
        with set_forward_context(meta), torch.no_grad():
            got = compiled(*qkv)
        worst = max(worst, float((got - want).abs().max()))
        stored = all(torch.equal(a, b) for a, b in zip(layer.kv_cache, want_caches))
    return {"check": "decode-torch.compile-fullgraph", "ok": worst < 1e-4 and stored, "max_abs_fast_vs_native": worst}


def check_fused_merge_graph():
    """The fused merge replayed from a CUDA graph: each replay equals the two-kernel merge and
    leaves the split counters at zero (the merging program resets them)."""
    batch, context = (2, 3000) if DEVICE.type == "cuda" else (2, 90)
    q, (kc, vc), bt, seq_lens = decode_inputs(batch, context, seed=5)
    seq_lens[1] = context // 3  # uneven: some splits of row 1 are empty
    fused = dataclasses.replace(pd_decode.DECODE_CONFIG, fused_merge=True)
    want = pd_decode.paged_decode(q, kc, vc, bt, seq_lens, HD ** -0.5, num_splits=8)
    out = torch.zeros_like(want)
    pd_decode.paged_decode(q, kc, vc, bt, seq_lens, HD ** -0.5, out=out, config=fused, num_splits=8)
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            pd_decode.paged_decode(q, kc, vc, bt, seq_lens, HD ** -0.5, out=out, config=fused, num_splits=8)
        for _ in range(3):
            out.zero_()
            graph.replay()
        torch.cuda.synchronize()
    err = float((out.float() - want.float()).abs().max())
    counters_zero = counters_left_zero("paged_decode_merge")
    return {"check": "decode-fused-merge-graph-replays", "ok": err < 2e-2 and counters_zero,
            "max_abs_fast_vs_native": err}


def run_checks():
    rows = [check_fused_merge_graph()]
    for name, (ctx, q) in CHECK_BATCHES.items():
        rows += check_batch(name, ctx, q)
    rows.append(check_padded_graph_replay())
    if not ARGS.no_compile:
        rows.append(check_compile())
    return rows


# ---- 3. store and decode --------------------------------------------------------------------------

def time_store(timer, copy_tbps):
    rows = []
    for tokens in STORE_TOKENS:
        g = gen(tokens)
        qkv = torch.randn(tokens, (NQ + 2 * NK) * HD, generator=g, device=DEVICE).to(torch.bfloat16)
        k, v = qkv[:, NQ * HD: (NQ + NK) * HD], qkv[:, (NQ + NK) * HD:]
        blocks = -(-tokens // BLOCK) + 8
        caches = [torch.empty(blocks, BLOCK, NK, HD, device=DEVICE, dtype=torch.bfloat16) for _ in "kv"]
        slots = torch.randperm(blocks * BLOCK, generator=g, device=DEVICE)[:tokens]
        nbytes = 2 * 2 * tokens * NK * HD * 2 + tokens * 8  # K and V read + written, slots read
        for warps in STORE_WARPS:
            t = timer(lambda: store_kv_cache_triton(k, v, caches[0], caches[1], slots, num_warps=warps))
            tbps = nbytes / (t["us"] * 1e-6) / 1e12
            rows.append({"tokens": tokens, "num_warps": warps, **t, "tbps": tbps, "frac_copy": tbps / copy_tbps})
    return rows


def decode_inputs(batch, context, seed=0):
    g = gen(seed)
    tables, blocks = shuffled_tables([context] * batch, g)
    bt = torch.tensor(tables, dtype=torch.int32, device=DEVICE)
    caches = [torch.randn(blocks, BLOCK, NK, HD, generator=g, device=DEVICE).to(torch.bfloat16) for _ in "kv"]
    qkv = torch.randn(batch, (NQ + 2 * NK) * HD, generator=g, device=DEVICE).to(torch.bfloat16)
    q = qkv[:, : NQ * HD].view(batch, NQ, HD)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=DEVICE)
    return q, caches, bt, seq_lens


def decode_bytes(batch, context):
    return (batch * context * NK * HD * 2 + 2 * batch * NQ * HD) * 2  # KV once, q in + out, bf16


def decode_configs():
    """(label, config): the default, the previous default, single-knob changes, then the sweep."""
    base = pd_decode.DECODE_CONFIG
    out = [("default", base), ("previous-default", dataclasses.replace(base, **PREVIOUS_DEFAULT))]
    if not ARGS.no_sweep:
        out += [("default+" + ",".join(f"{k}={v}" for k, v in change.items()), dataclasses.replace(base, **change))
                for change in EXTRA_DECODE]
        keys = list(SWEEP)
        out += [("sweep", dataclasses.replace(base, **dict(zip(keys, values))))
                for values in itertools.product(*(SWEEP[k] for k in keys))]
    seen, unique = set(), []
    for label, cfg in out:
        if cfg not in seen:
            seen.add(cfg)
            unique.append((label, cfg))
    return unique


def time_decode(timer, copy_tbps, floor_us):
    rows = []
    for batch, context in DECODE_SHAPES:
        q, (kc, vc), bt, seq_lens = decode_inputs(batch, context)
        baseline = pd_decode.paged_decode(q, kc, vc, bt, seq_lens, HD ** -0.5)
        nbytes = decode_bytes(batch, context)
        timed = {}  # launch key -> timing, so configs that launch the same thing are timed once
        for label, cfg in decode_configs():
            splits = pd_config.decode_num_splits(batch, NK, bt.shape[1], pd_device.sm_count(DEVICE), cfg)
            key = (cfg.blocks_per_iter, cfg.num_warps, cfg.num_stages, cfg.fused_merge and splits > 1, splits)
            row = {"batch": batch, "context": context, "label": label, "config": dataclasses.asdict(cfg),
                   "default": cfg == pd_decode.DECODE_CONFIG, "splits": splits}
            if key not in timed:
                out = torch.zeros(batch, NQ, HD, dtype=q.dtype, device=DEVICE)

                def fn(cfg=cfg, out=out):
                    return pd_decode.paged_decode(q, kc, vc, bt, seq_lens, HD ** -0.5, out=out, config=cfg)
                try:
                    t = timer(fn, budget_s=0.08)
                    t["max_abs_vs_default"] = float((out.float() - baseline.float()).abs().max())
                except Exception as exc:  # noqa: BLE001 - a knob setting the compiler rejects
                    t = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                    if timer.cuda:
                        torch.cuda.synchronize()
                timed[key] = t
            t = timed[key]
            if "error" not in t:
                kernel_us = max(t["us"] - floor_us, 1e-3)
                t = {**t, "tbps": nbytes / (t["us"] * 1e-6) / 1e12, "frac_copy": nbytes / (t["us"] * 1e-6) / 1e12 / copy_tbps,
                     "frac_kernel": nbytes / (kernel_us * 1e-6) / 1e12 / copy_tbps}
            rows.append({**row, **t})
    return rows


# ---- 4. prefill -------------------------------------------------------------------------------------

def prefill_flops(context, query):
    return 4 * NQ * HD * sum(n * (c + (n + 1) / 2) for c, n in zip(context, query))


def prefill_case(name, context, query, timer):
    meta, (q, k, v), caches = step_inputs(context, query, torch.bfloat16, seed=7)
    q3, k3, v3 = (x.reshape(x.shape[0], -1, HD) for x in (q, k, v))
    kv_full = []
    for i, (c, n) in enumerate(zip(context, query)):
        if c:  # chunk over cached context: keys from the cache (as the layer gathers them)
            blocks = meta.block_tables[i, : -(-(c + n) // BLOCK)].long()
            kv_full.append(tuple(cache[blocks].flatten(0, 1)[: c + n] for cache in caches))
        else:
            kv_full.append(None)
    reference = None
    rows = []
    for variant, backend, expand in PREFILL_VARIANTS:
        config = PrefillConfig("auto", expand)

        def fn():
            start = 0
            outs = []
            for (c, n), kv in zip(zip(context, query), kv_full):
                ks, vs = kv if kv else (k3[start: start + n], v3[start: start + n])
                outs.append(sdpa_causal(q3[start: start + n], ks, vs, c, HD ** -0.5, config))
                start += n
            return outs

        scope = sdpa_kernel([BACKENDS[backend]]) if backend else contextlib.nullcontext()
        try:
            with scope:
                outs = fn()
                t = timer(fn, budget_s=0.3)
        except Exception as exc:  # noqa: BLE001 - this backend refuses these inputs
            rows.append({"case": name, "variant": variant, "error": f"{type(exc).__name__}: {str(exc)[:160]}"})
            continue
        out = torch.cat([o.float() for o in outs])
        reference = out if reference is None else reference
        rows.append({"case": name, "variant": variant, **t,
                     "tflops": prefill_flops(context, query) / (t["us"] * 1e-6) / 1e12,
                     "max_abs_vs_auto": float((out - reference).abs().max())})
    return rows


def time_prefill(timer):
    rows = []
    for tokens in PREFILL_TOKENS:
        rows += prefill_case(f"causal-T{tokens}", [0], [tokens], timer)
    rows += prefill_case(f"varlen-{'.'.join(map(str, VARLEN))}", [0] * len(VARLEN), VARLEN, timer)
    rows += prefill_case(f"chunk-Q{CHUNK[1]}-C{CHUNK[0]}", [CHUNK[0]], [CHUNK[1]], timer)
    return rows


# ---- report -----------------------------------------------------------------------------------------

def knobs(c):
    return (f"{c['blocks_per_iter']}/{c['num_warps']}/{c['num_stages']}/{c['programs_per_sm']}/"
            f"{c['small_batch_programs_per_sm']}/{c['max_splits']}/{'F' if c['fused_merge'] else '-'}")


def decode_table(result):
    """Per shape: default vs previous default vs best (raw and kernel-only fractions of the
    roofline), best with and without the fused merge; then the best single config over all shapes."""
    fmt = lambda r: f"{r['us']:.1f} | {r['frac_copy']:.2f} | {r['frac_kernel']:.2f}" if r else "- | - | -"
    lines = ["", f"timing floor (graph of one trivial kernel, flush + events): {result['floor_us']:.1f} us; "
             f"frac = bytes/t/copy, kern = bytes/(t-floor)/copy; knobs = bpi/warps/stages/pps/small_pps/max_splits/fused",
             "| decode | splits | default us | frac | kern | previous us | frac | kern | best knobs | best us | frac | "
             "kern | best unfused us | best fused us |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    rows = [r for r in result["decode"] if "us" in r]
    for batch, context in DECODE_SHAPES:
        rs = [r for r in rows if r["batch"] == batch and r["context"] == context]
        errors = sum(1 for r in result["decode"] if r["batch"] == batch and r["context"] == context and "error" in r)
        if not rs:
            lines.append(f"| B{batch} C{context} | all {errors} variants failed |" + " |" * 12)
            continue
        default = next((r for r in rs if r["default"]), None)
        previous = next((r for r in rs if r["label"] == "previous-default"), None)
        best = min(rs, key=lambda r: r["us"])
        unfused = min((r["us"] for r in rs if not (r["config"]["fused_merge"] and r["splits"] > 1)), default=float("nan"))
        fused = min((r["us"] for r in rs if r["config"]["fused_merge"] and r["splits"] > 1), default=float("nan"))
        lines.append(f"| B{batch} C{context} | {default['splits'] if default else '-'} | {fmt(default)} | {fmt(previous)} | "
                     f"{knobs(best['config'])} | {fmt(best)} | {unfused:.1f} | {fused:.1f} |"
                     + (f" ({errors} variants failed)" if errors else ""))
    by_cfg = {}
    for r in rows:
        by_cfg.setdefault(json.dumps(r["config"], sort_keys=True), []).append(r["frac_copy"])
    full = {k: v for k, v in by_cfg.items() if len(v) == len(DECODE_SHAPES)}
    if full:
        geo = {k: math.exp(math.fsum(map(math.log, v)) / len(v)) for k, v in full.items()}
        best_cfg = max(geo, key=geo.get)
        default_key = json.dumps(dataclasses.asdict(pd_decode.DECODE_CONFIG), sort_keys=True)
        result["decode_best_config"] = json.loads(best_cfg)
        lines.append(f"best single decode config over all shapes: geomean frac {geo[best_cfg]:.3f} "
                     f"(default {geo.get(default_key, float('nan')):.3f}): {knobs(json.loads(best_cfg))}")
    return lines


def tables(result):
    lines = [f"device: {result['device']}  torch {result['torch']}  triton {result['triton']}  "
             f"copy {result['copy_tbps']:.2f} TB/s (fk_pytest.timing.measure_roofline)", "",
             "| check | ok | max abs fast-native | ratio |", "|---|---|---|---|"]
    for r in result["checks"]:
        lines.append(f"| {r['check']} | {r['ok']} | {r.get('max_abs_fast_vs_native', float('nan')):.2e} | "
                     f"{r.get('ratio', float('nan')):.2f} |")
    lines += ["", "| store tokens | warps | us | TB/s | frac copy |", "|---|---|---|---|---|"]
    for r in result["store"]:
        lines.append(f"| {r['tokens']} | {r['num_warps']} | {r['us']:.1f} | {r['tbps']:.2f} | "
                     f"{r['frac_copy']:.2f} |")
    lines += decode_table(result)
    lines += ["", "| prefill case | variant | us | TFLOP/s | max abs vs first | mode |", "|---|---|---|---|---|---|"]
    for r in result["prefill"]:
        if "error" in r:
            lines.append(f"| {r['case']} | {r['variant']} | - | - | {r['error'][:60]} | |")
        else:
            lines.append(f"| {r['case']} | {r['variant']} | {r['us']:.1f} | {r['tflops']:.1f} | "
                         f"{r['max_abs_vs_auto']:.2e} | {r['mode']} |")
    return lines


def main():
    t0 = time.time()
    timer = Timer(DEVICE, budget_s=0.15)
    import triton
    result = {"device": torch.cuda.get_device_name() if timer.cuda else "cpu (interpreter smoke)",
              "torch": torch.__version__, "triton": triton.__version__,
              "decode_default_config": dataclasses.asdict(pd_decode.DECODE_CONFIG)}
    sections = [("checks", run_checks), ("copy_tbps", lambda: copy_bandwidth_tbps(timer)),
                ("floor_us", lambda: timing_floor_us(timer))]
    for name, fn in sections:
        try:
            result[name] = fn()
        except Exception:  # noqa: BLE001 - report and go on: one GPU run must give every number it can
            result[name] = [{"check": name, "ok": False, "error": traceback.format_exc()[-600:]}] \
                if name == "checks" else float("nan")
            print(traceback.format_exc(), file=sys.stderr)
    for name, fn in [("store", lambda: time_store(timer, result["copy_tbps"])),
                     ("decode", lambda: time_decode(timer, result["copy_tbps"], result["floor_us"])),
                     ("prefill", lambda: time_prefill(timer))]:
        try:
            result[name] = fn()
        except Exception:  # noqa: BLE001
            result[name] = []
            result.setdefault("errors", []).append(traceback.format_exc()[-800:])
            print(traceback.format_exc(), file=sys.stderr)
        print(f"[{time.time() - t0:.0f}s] {name} done", file=sys.stderr)
    lines = tables(result)
    result["wall_s"] = time.time() - t0
    if os.environ.get("OUT"):
        os.makedirs(os.environ["OUT"], exist_ok=True)
        with open(os.path.join(os.environ["OUT"], "attention.json"), "w") as f:
            json.dump(result, f, indent=1, default=str)
    print("\n".join(lines))
    print(f"wall {result['wall_s']:.0f}s; all checks ok: {all(r.get('ok') for r in result['checks'])}")
    return 0 if all(r.get("ok") for r in result["checks"]) else 1


if __name__ == "__main__":
    sys.exit(main())
