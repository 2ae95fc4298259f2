"""MLA (DeepSeek-V2-Lite shapes) on the GPU: correctness of the fast path, and its speed against
what a user has without an MLA kernel.

Per case (16 heads, nope 128, rope 64, v 128, latent 512, bf16, block size 16, shuffled blocks):

* correctness: relative L2 error against the float64 definition (``forward_native`` upcast) of
  the fast path (Triton store + absorbed split-K latent decode / expanded SDPA prefill) and of the
  native path in bf16; the ratio fast / native should be <= 2;
* timing of ours for decode: the suite's amortised CUDA-graph method (src/fk_pytest/timing.py): a
  graph of one call and a graph of K calls, call j on its own copy of the layer, cache and inputs
  (rotated: no call finds the cache or the absorbed weights in L2 from the one before), K so that a
  K-call replay lasts >= 100 us, the L2 flushed before every replay; per call = median over rounds of
  (K-call replay - one-call replay) / (K - 1), the replay's fixed ~4 us cancelling. The one-call
  replay is kept beside it (``single``);
* timing of the rest (L2 flushed before every call, CUDA events, median): ``sdpa-expanded``
  (latent store + gather, kv_b_proj expansion, SDPA per sequence), ``eager`` (``forward_native`` in
  bf16), and for prefill ours; prefill also times ours and the peer as CUDA-graph replays (the
  difference to the eager figure is host launch overhead) and every ``MLAPrefillConfig`` (V padded
  to 192 or not, explicit bool mask or ``causal_lower_right``);
* achieved bandwidth of ours for decode: latent cache bytes read + kv_b_proj weights + q/out,
  against the H200's 4.24 TB/s;
* sweep (B1 C8192, B32 C2048 and B139 C1152; ``--no-sweep`` skips it, ``--only-sweep`` runs only it): ``MLADecodeConfig`` variants (tokens per
  iteration, warps, pipeline stages, programs per SM, split cap) and the previous launch, timed side
  by side with the same amortised method. Read the ``per call us`` column: the fastest row at both
  cases is the best default (``MLA_DECODE_CONFIG`` in kernels_reference/ops/mla_decode/decode.py).

    python3 -m benchmarks mla             (GPU; writes $OUT/h200_mla.json when $OUT is set)
    python3 -m benchmarks mla --tiny-cpu  (a CPU check of this script, Triton interpreted)
"""
import copy
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

TINY = "--tiny-cpu" in sys.argv
SWEEP = "--no-sweep" not in sys.argv
if TINY:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is imported

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "src")]
from kernels_reference.forward_context import AttentionMetadata, set_forward_context  # noqa: E402
from kernels_reference.L1 import mla_attention as mla_module  # noqa: E402
from kernels_reference.ops.mla_decode import decode as decode_module  # noqa: E402
from kernels_reference.L1.mla_attention import MLAAttention  # noqa: E402
from fk_pytest.timing import flushed_replay_us  # noqa: E402
from benchmarks.graph_timing import AmortisedGraphs, Timer, time_amortised  # noqa: E402
from kernels_reference.L2.deepseek_v2_attention import softmax_scale  # noqa: E402

CFG = json.loads((Path(__file__).resolve().parents[1] / "tasks/configs/deepseek-v2-lite.json").read_text())
HEADS, NOPE, ROPE, V, RANK = (CFG["num_attention_heads"], CFG["qk_nope_head_dim"], CFG["qk_rope_head_dim"],
                              CFG["v_head_dim"], CFG["kv_lora_rank"])
BLOCK = 16
PEAK_TBPS = 4.24  # H200 HBM3e
DEVICE = torch.device("cpu" if TINY else "cuda")
DTYPE = torch.bfloat16
if TINY:
    CASES = {"decode-B2-C40": ([40, 23], [1, 1]), "prefill-B1-Q20": ([0], [20]), "chunk-Q8-C24": ([24], [8])}
else:
    CASES = {"decode-B1-C8192": ([8191], [1]),
             "decode-B32-C2048": ([1024 + (37 * i) % 1024 for i in range(32)], [1] * 32),
             "decode-B128-C1024": ([512 + (53 * i) % 512 for i in range(128)], [1] * 128),
             # the peer table's largest decode step (139 sequences of ~1152 tokens), where FlashInfer's
             # MLA decode took 168 us and ours 609 on the H100 (2026-12-05): one program per sequence
             "decode-B139-C1152": ([640 + (61 * i) % 1024 for i in range(139)], [1] * 139),
             "prefill-B1-Q2048": ([0], [2048]),
             "prefill-chunk-Q1024-C3072": ([3072], [1024])}
SWEEP_CASES = ("decode-B1-C8192", "decode-B32-C2048", "decode-B139-C1152", "decode-B2-C40")
if "--only-sweep" in sys.argv:  # the sweep's cases alone (a short device call)
    CASES = {name: shape for name, shape in CASES.items() if name in SWEEP_CASES}
_D = decode_module.MLA_DECODE_CONFIG
SWEEP_CONFIGS = {
    "default": _D,
    "previous (32-split cap, 4/SM)": decode_module.PREVIOUS_CONFIG,
    "1 program/SM": dataclasses.replace(_D, programs_per_sm=1),
    "4 programs/SM": dataclasses.replace(_D, programs_per_sm=4),
    "8 programs/SM": dataclasses.replace(_D, programs_per_sm=8),
    "16 programs/SM": dataclasses.replace(_D, programs_per_sm=16),
    "split cap 64": dataclasses.replace(_D, max_splits=64),
    "split cap 256": dataclasses.replace(_D, max_splits=256),
    "16 tokens/iter": dataclasses.replace(_D, tokens_per_iter=16),
    "64 tokens/iter": dataclasses.replace(_D, tokens_per_iter=64),
    "8 warps": dataclasses.replace(_D, num_warps=8),
    "1 stage": dataclasses.replace(_D, num_stages=1),
    "3 stages": dataclasses.replace(_D, num_stages=3),
}
PREFILL_CONFIGS = {
    "unpadded V, bool mask": mla_module.MLAPrefillConfig(pad_v=False, mask="bool"),
    "V padded to 192, bool mask": mla_module.MLAPrefillConfig(pad_v=True, mask="bool"),
    "unpadded V, causal_lower_right (default)": mla_module.MLAPrefillConfig(pad_v=False, mask="lower-right-bias"),
    "V padded, causal_lower_right (previous)": mla_module.MLAPrefillConfig(pad_v=True, mask="lower-right-bias"),
}
ROUNDS = 5 if TINY else 25
AMORTISE_TARGET_US = 100.0


def rotated_calls(layer, meta, inputs, cache, count):
    """``count`` calls of ours, each on its own copy of the layer (its absorbed weights), the cache
    and the inputs: no call finds its bytes in L2 from the call before."""
    calls = []
    for j in range(count):
        lj = copy.deepcopy(layer) if j else layer
        cj = cache.clone()
        ij = {k: v.clone() for k, v in inputs.items()}
        calls.append(lambda lj=lj, cj=cj, ij=ij: run(lj, meta, ij, cj, "ours"))
    return calls


def decode_times(case, layer, meta, inputs, cache, timer, truth, configs):
    """Ours per call (amortised) under each decode config; on the CPU one wall-clock call each.
    Also the relative error of each config's graph output (a broken config shows here)."""
    results = {}
    if DEVICE.type != "cuda":
        for name, cfg in configs.items():
            decode_module.MLA_DECODE_CONFIG = cfg
            try:
                t0 = time.perf_counter()
                got = run(layer, meta, inputs, cache.clone(), "ours")
                results[name] = {"us": (time.perf_counter() - t0) * 1e6, "mode": "cpu-wall", "error": rel(got, truth)}
            finally:
                decode_module.MLA_DECODE_CONFIG = _D
        return results
    probe = AmortisedGraphs(rotated_calls(layer, meta, inputs, cache, 1))
    k = int(min(max(math.ceil(AMORTISE_TARGET_US / flushed_replay_us(probe.one, timer.flush)), 2), 16))
    del probe
    calls = rotated_calls(layer, meta, inputs, cache, k)
    runners = {}
    for name, cfg in configs.items():
        decode_module.MLA_DECODE_CONFIG = cfg
        try:
            runners[name] = AmortisedGraphs(calls)
        finally:
            decode_module.MLA_DECODE_CONFIG = _D
    results = time_amortised(runners, timer.flush, ROUNDS)
    for name, r in runners.items():  # outputs of the timed graphs after all their replays
        r.one.replay()
        torch.cuda.synchronize()
        results[name]["error"] = rel(r.one_out, truth)
    return results


def splits_of(cfg, context, query):
    blocks = max(-(-(c + q) // BLOCK) for c, q in zip(context, query))
    sms = decode_module.sm_count(DEVICE)
    return decode_module.mla_num_splits(len(query), -(-HEADS // decode_module.HEAD_BLOCK), blocks, BLOCK, sms, cfg)


def build_case(context, query, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    need = [-(-(c + n) // BLOCK) for c, n in zip(context, query)]
    order = torch.randperm(sum(need) + 2, generator=g).tolist()
    tables, at = [], 0
    for n in need:
        tables.append(order[at:at + n])
        at += n
    meta = AttentionMetadata.build(context, query, BLOCK, device=DEVICE, block_tables=tables)
    t = sum(query)
    rnd = lambda *shape: torch.randn(*shape, generator=g).to(DEVICE, DTYPE)  # noqa: E731
    inputs = dict(q=rnd(t, HEADS * (NOPE + ROPE)), kv_c_normed=rnd(t, RANK), k_pe=rnd(t, RANK + ROPE)[:, RANK:])
    cache = rnd(len(order), BLOCK, RANK + ROPE)
    layer = MLAAttention(HEADS, softmax_scale(NOPE + ROPE, CFG["rope_scaling"]), NOPE, ROPE, V, RANK)
    with torch.no_grad():
        layer.kv_b_proj.weight.copy_(torch.randn(layer.kv_b_proj.weight.shape, generator=g) * RANK ** -0.5)
    return meta, inputs, cache, layer.to(DEVICE, DTYPE).eval()


def sdpa_expanded(layer, meta, q, kv_c_normed, k_pe):
    """What a user without an MLA kernel does (the tasks.peers ``sdpa-expanded`` peer)."""
    cache = layer.kv_cache
    t = q.shape[0]
    flat = cache.view(-1, RANK + ROPE)
    flat.index_copy_(0, meta.slot_mapping, torch.cat([kv_c_normed, k_pe], -1))
    qh = q.view(t, HEADS, NOPE + ROPE)
    out = q.new_empty(t, HEADS, V)
    start = 0
    for i, (ql, n) in enumerate(zip(meta.query_lens_cpu, meta.seq_lens_cpu)):
        a, start = start, start + ql
        blocks = meta.block_tables[i, : -(-n // BLOCK)].long()
        hist = cache.index_select(0, blocks).reshape(-1, RANK + ROPE)[:n]
        kv = F.linear(hist[:, :RANK], layer.kv_b_proj.weight).view(n, HEADS, NOPE + V)
        k = torch.cat([kv[..., :NOPE], hist[:, None, RANK:].expand(n, HEADS, ROPE)], -1)
        qi, ki, vi = (x.transpose(0, 1).unsqueeze(0) for x in (qh[a:start], k, kv[..., NOPE:]))
        if ql == 1 or n == ql:
            oi = F.scaled_dot_product_attention(qi, ki, vi, is_causal=ql > 1, scale=layer.scale)
        else:
            mask = torch.arange(n, device=q.device)[None] <= torch.arange(ql, device=q.device)[:, None] + (n - ql)
            oi = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, scale=layer.scale)
        out[a:start] = oi[0].transpose(0, 1)
    return out.reshape(t, -1)


def run(layer, meta, inputs, cache, how):
    layer.kv_cache = cache
    with torch.no_grad(), set_forward_context(meta):
        if how == "sdpa-expanded":
            return sdpa_expanded(layer, meta, **inputs)
        return getattr(layer, {"ours": "forward_fast", "eager": "forward_native"}[how])(**inputs)


def rel(x, truth):
    return float((x.double() - truth).norm() / truth.norm())


def decode_bytes(context, query):
    rows = sum(c + q for c, q in zip(context, query))
    weights = HEADS * (NOPE + V) * RANK
    acts = sum(query) * (HEADS * (NOPE + ROPE) + RANK + ROPE + HEADS * V)
    return (rows * (RANK + ROPE) + weights + acts) * 2


def case_result(name, context, query, timer):
    meta, inputs, cache, layer = build_case(context, query)
    truth_layer = MLAAttention(HEADS, layer.scale, NOPE, ROPE, V, RANK).to(DEVICE, torch.float64)
    truth_layer.load_state_dict(layer.state_dict())
    truth = run(truth_layer, meta, {k: v.double() for k, v in inputs.items()}, cache.double(), "eager")
    errors = {how: rel(run(layer, meta, inputs, cache.clone(), how), truth) for how in ("ours", "eager", "sdpa-expanded")}
    out = {"case": name, "errors": errors, "ratio_ours_vs_native": errors["ours"] / max(errors["eager"], 1e-9)}
    decode = all(q == 1 for q in query)
    times = {}
    for how in ("sdpa-expanded", "eager") if decode else ("ours", "sdpa-expanded", "eager"):
        c = cache.clone()
        times[how] = timer(lambda how=how, c=c: run(layer, meta, inputs, c, how), graph=False)
    if decode:
        configs = SWEEP_CONFIGS if SWEEP and name in SWEEP_CASES else {"default": _D}
        sweep = decode_times(name, layer, meta, inputs, cache, timer, truth, configs)
        for cfg_name, r in sweep.items():
            r["splits"] = splits_of(configs[cfg_name], context, query)
            r["config"] = dataclasses.asdict(configs[cfg_name])
        times["ours"] = sweep["default"]
        if len(sweep) > 1:
            out["sweep"] = sweep
    else:
        c = cache.clone()
        for how in ("ours", "sdpa-expanded"):  # as graph replays: eager minus graph = host overhead
            times[f"{how}-graph"] = timer(lambda how=how: run(layer, meta, inputs, c, how), graph=True)
        variants = {}
        for cfg_name, cfg in PREFILL_CONFIGS.items():
            mla_module.PREFILL = cfg
            try:
                got = run(layer, meta, inputs, cache.clone(), "ours")
                variants[cfg_name] = timer(lambda: run(layer, meta, inputs, c, "ours"), graph=False)
                variants[cfg_name]["error"] = rel(got, truth)
            finally:
                mla_module.PREFILL = mla_module.MLAPrefillConfig()
        out["prefill_variants"] = variants
    out["times"] = times
    if decode:
        nbytes = decode_bytes(context, query)
        tbps = nbytes / (times["ours"]["us"] * 1e-6) / 1e12
        out.update(bytes=nbytes, tbps=tbps, peak_frac=tbps / PEAK_TBPS)
    else:
        pairs = sum(q * (c + (q + 1) / 2) for c, q in zip(context, query))
        flops = 2 * HEADS * (pairs * (NOPE + ROPE + V) + sum(c + q for c, q in zip(context, query)) * RANK * (NOPE + V))
        out.update(flops=flops, tflops=flops / (times["ours"]["us"] * 1e-6) / 1e12)
    return out


def main():
    t0 = time.time()
    torch.manual_seed(0)
    timer = Timer(DEVICE, budget_s=0.2)
    results = [case_result(name, ctx, q, timer) for name, (ctx, q) in CASES.items()]
    env = {"device": torch.cuda.get_device_name() if DEVICE.type == "cuda" else "cpu (interpreted)",
           "torch": torch.__version__, "seconds": time.time() - t0}
    try:
        import triton
        env["triton"] = triton.__version__
    except ImportError:
        pass
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "h200_mla.json").write_text(json.dumps({"env": env, "results": results}, indent=1))
    unit = "amortised CUDA-graph us per call" if DEVICE.type == "cuda" else "CPU interpreter wall us: no meaning"
    for r in results:
        if "sweep" not in r:
            continue
        print(f"\nDecode sweep, {r['case']} ({unit}; 'single' = one flushed graph replay)\n")
        print("| config | splits | per call us | spread | single us | K | rel err |")
        print("|---|---|---|---|---|---|---|")
        for cfg_name, t in sorted(r["sweep"].items(), key=lambda kv: kv[1]["us"]):
            print(f"| {cfg_name} | {t['splits']} | {t['us']:.1f} | {t.get('spread', 0):.2f} | "
                  f"{t.get('single_us', float('nan')):.1f} | {t.get('calls', 1)} | {t['error']:.2e} |")
    print("\nPrefill: ours under each MLAPrefillConfig (CUDA events, L2 flushed), and as graph replays\n")
    print("| case | variant | us | rel err |")
    print("|---|---|---|---|")
    for r in results:
        if "prefill_variants" not in r:
            continue
        for v_name, t in r["prefill_variants"].items():
            print(f"| {r['case']} | {v_name} | {t['us']:.1f} | {t['error']:.2e} |")
        for how in ("ours-graph", "sdpa-expanded-graph"):
            t = r["times"][how]
            print(f"| {r['case']} | {how} ({t['mode']}) | {t['us']:.1f} | |")
    print(f"\nMLA, DeepSeek-V2-Lite shapes, bf16, block {BLOCK} ({env['device']}, torch {env['torch']}, "
          f"{env['seconds']:.0f} s; decode ours: amortised CUDA graphs, the rest: CUDA events)\n")
    print("| case | err ours | err native bf16 | ratio (<= 2) | ours us (mode) | sdpa-expanded us | eager us "
          "| speedup vs sdpa-expanded | TB/s (% of 4.24) or TFLOP/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        t = r["times"]
        perf = (f"{r['tbps']:.2f} ({100 * r['peak_frac']:.0f}%); single replay {t['ours'].get('single_us', 0):.1f} us"
                if "tbps" in r else f"{r['tflops']:.0f} TFLOP/s; graph {t['ours-graph']['us']:.0f} us")
        print(f"| {r['case']} | {r['errors']['ours']:.2e} | {r['errors']['eager']:.2e} | "
              f"{r['ratio_ours_vs_native']:.2f} | {t['ours']['us']:.1f} ({t['ours']['mode']}) | "
              f"{t['sdpa-expanded']['us']:.1f} | {t['eager']['us']:.1f} | "
              f"{t['sdpa-expanded']['us'] / t['ours']['us']:.2f}x | {perf} |")


if __name__ == "__main__":
    main()
