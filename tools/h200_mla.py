"""MLA (DeepSeek-V2-Lite shapes) on the GPU: correctness of the fast path, and its speed against
what a user has without an MLA kernel.

Per case (16 heads, nope 128, rope 64, v 128, latent 512, bf16, block size 16, shuffled blocks):

* correctness: relative L2 error against the float64 definition (``forward_native`` upcast) of
  the fast path (Triton store + absorbed split-K latent decode / expanded SDPA prefill) and of the
  native path in bf16; the ratio fast / native should be <= 2;
* timing (L2 flushed before every call, CUDA-graph replay where capturable, else CUDA events;
  median): ours (``forward_fast``), ``sdpa-expanded`` (latent store + gather, kv_b_proj expansion,
  SDPA per sequence) and ``eager`` (``forward_native`` in bf16); prefill also times ours without
  the V padding (FlashAttention needs equal head sizes; without padding torch picks another backend);
* achieved bandwidth of ours for decode: latent cache bytes read + kv_b_proj weights + q/out,
  against the H200's 4.24 TB/s.

    python3 tools/h200_mla.py             (GPU; writes $OUT/h200_mla.json when $OUT is set)
    python3 tools/h200_mla.py --tiny-cpu  (a CPU check of this script, Triton interpreted)
"""
import json
import os
import statistics
import sys
import time
from pathlib import Path

TINY = "--tiny-cpu" in sys.argv
if TINY:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is imported

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "src")]
from kernels_reference.forward_context import AttentionMetadata, set_forward_context  # noqa: E402
from kernels_reference.L1 import mla_attention as mla_module  # noqa: E402
from kernels_reference.L1.mla_attention import MLAAttention  # noqa: E402
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
             "prefill-B1-Q2048": ([0], [2048]),
             "prefill-chunk-Q1024-C3072": ([3072], [1024])}


class Timer:
    def __init__(self):
        if DEVICE.type == "cuda":
            from fk_pytest.timing import L2Flusher
            self.flush = L2Flusher(DEVICE)

    def __call__(self, fn, budget_s=0.2, graph=True):
        if DEVICE.type != "cuda":
            fn()
            t0 = time.perf_counter()
            fn()
            return {"us": (time.perf_counter() - t0) * 1e6, "mode": "cpu-wall"}
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
            fn()
        torch.cuda.current_stream().wait_stream(side)
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
        return {"us": statistics.median(s.elapsed_time(e) * 1e3 for s, e in events), "mode": mode, "rounds": rounds}


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
    for how in ("ours", "sdpa-expanded", "eager"):
        c = cache.clone()
        times[how] = timer(lambda how=how, c=c: run(layer, meta, inputs, c, how), graph=decode and how == "ours")
    if not decode:
        mla_module.PAD_V_FOR_FLASH = False
        c = cache.clone()
        times["ours-unpadded-v"] = timer(lambda: run(layer, meta, inputs, c, "ours"), graph=False)
        mla_module.PAD_V_FOR_FLASH = True
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
    timer = Timer()
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
    print(f"\nMLA, DeepSeek-V2-Lite shapes, bf16, block {BLOCK} ({env['device']}, torch {env['torch']}, "
          f"{env['seconds']:.0f} s)\n")
    print("| case | err ours | err native bf16 | ratio (<= 2) | ours us (mode) | sdpa-expanded us | eager us "
          "| speedup vs sdpa-expanded | TB/s (% of 4.24) or TFLOP/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        t = r["times"]
        perf = (f"{r['tbps']:.2f} ({100 * r['peak_frac']:.0f}%)" if "tbps" in r else
                f"{r['tflops']:.0f} TFLOP/s; unpadded V {t['ours-unpadded-v']['us']:.0f} us")
        print(f"| {r['case']} | {r['errors']['ours']:.2e} | {r['errors']['eager']:.2e} | "
              f"{r['ratio_ours_vs_native']:.2f} | {t['ours']['us']:.1f} ({t['ours']['mode']}) | "
              f"{t['sdpa-expanded']['us']:.1f} | {t['eager']['us']:.1f} | "
              f"{t['sdpa-expanded']['us'] / t['ours']['us']:.2f}x | {perf} |")


if __name__ == "__main__":
    main()
