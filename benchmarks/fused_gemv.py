"""The fused decode GEMVs (kernels_reference/ops/fused_gemv/gemv.py) against what they replace, at
Llama-3.1-8B's shapes, batch 1, on one GPU, side by side in one run:

* ``cublas``: the projection alone (``F.linear``, cuBLAS), the floor the fused kernel competes with;
* ``unfused``: the module chain it replaces (fused-add RMSNorm -> F.linear -> RoPE -> KV store, or
  fused-add RMSNorm -> F.linear -> SiluAndMul), the reference modules' own kernels;
* ``fused``: the fused kernel, for each GPU tile in ``TILES`` (the first is the committed default);
  for the o and down projections (nothing fused) the same kernel as a plain GEMV (``gemv``).

Each case runs LAYERS times in a row in one CUDA graph, each call on its own weight copy (as
consecutive layers do, so no call finds its weights in L2), the L2 flushed before each replay; the
table gives us per call and the weight bytes / time as a fraction of the copy bandwidth measured
in the same run. Each fused tile's output is checked against the unfused chain first; the fastest tile per kernel
kind is left in ``fused_gemv.GPU_TILES`` (the engine script runs its variants with them).

    PYTHONPATH=$PWD/src:$PWD python3 -m benchmarks fused_gemv      (device machine, ~1 min)
    python3 -m benchmarks fused_gemv --tiny-cpu                     (interpreter: checks the script)
"""
import argparse
import functools
import json
import os
import sys
from pathlib import Path

if "--tiny-cpu" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]
from kernels_reference.ops.fused_gemv import gemv as fused_gemv  # noqa: E402
from kernels_reference.ops.kv_store.store import store_kv_cache_triton  # noqa: E402
from kernels_reference.L1.rms_norm import RMSNorm  # noqa: E402
from kernels_reference.L1.rotary_emb import RotaryEmbedding  # noqa: E402
from kernels_reference.L1.silu_and_mul import SiluAndMul  # noqa: E402

def _tile(block_k, warps, row_acc=False, **extra):
    return dict(BLOCK_K=block_k, num_warps=warps, ROW_ACC=row_acc, **extra)


def _tma(block_k, half, stages, per_sm, warps=4):
    return dict(BLOCK_K=block_k, num_warps=warps, ROW_ACC=True, HALF=half, PER_SM=per_sm, TMA=True, STAGES=stages)


# The committed defaults first (fused_gemv.GPU_TILES), then weights through TMA descriptors in a
# loop Triton pipelines STAGES deep (cuBLAS's gate/up kernel streams that way at ~85% of DRAM peak
# against the register loop's ~77%, docs/perf/h200-engine.md "Nsight Compute"). Earlier sweeps
# ruled out weight prefetching (into registers, commits b7902d5..49a26cf (2026-12-01); into L2 before the PDL wait, commits 149a3b4..921bd58 (2026-12-01)
# run p), tensor-core loops (the token as the A operand, commits b7902d5..49a26cf (2026-12-01); the weights as A, commits 149a3b4..921bd58 (2026-12-01)
# run o) and HALF 32 register loops.
TILES = [_tile(512, 4, True), _tile(512, 4, True, PER_SM=5), _tile(1024, 8, True), _tile(512, 4),
         _tile(512, 4, PER_SM=3), _tile(1024, 8, True, PER_SM=4),
         # The norm statistics in K / BLOCK_K dependent steps (the default before commits 149a3b4..921bd58 (2026-12-01): the
         # whole row in one step took 0.135 ms off the engine's step, run p).
         _tile(512, 4, True, NORM_BLOCK=512),
         # Commits 149a3b4..921bd58 (2026-12-01): STAGES > 1 makes Triton pipeline the loop's loads through shared memory with
         # cp.async (an sm_90 compile shows 5 async copies per stage; 39 KB of shared memory per
         # program at 512 x 3 stages), so the next tiles are in flight while a tile is multiplied.
         _tile(512, 4, True, STAGES=2), _tile(512, 4, True, STAGES=3), _tile(256, 4, True, STAGES=4),
         _tile(256, 4, True, STAGES=6), _tile(512, 4, True, PER_SM=4, STAGES=3), _tile(1024, 8, True, STAGES=3),
         _tile(256, 4, True, HALF=8, STAGES=4), _tile(512, 8, True, STAGES=3)]
# Run m (docs/perf/h200-engine.md): the TMA tiles lost everywhere but the down projection, where
# (256, 8 rows, 6 stages, 4 per SM) streamed at 0.95 of copy against cuBLAS's 0.92 and the register
# loop's 0.90; picked for o/down, that tile made the engine's step 0.9 ms *slower* (not explained).
# So they are only timed on request (--tma), never picked for the engine's variants.
TMA_TILES = [_tma(64, 32, 6, 2), _tma(64, 16, 8, 4), _tma(128, 16, 6, 3), _tma(128, 32, 4, 2), _tma(256, 8, 6, 4),
             _tma(64, 32, 8, 2, warps=8), _tma(128, 8, 8, 4), _tma(64, 64, 6, 1), _tma(128, 16, 4, 4)]
EPILOGUE_OF = {"qkv": fused_gemv.ROPE_KV, "gate_up": fused_gemv.SILU_MUL, "o": fused_gemv.PLAIN,
               "down": fused_gemv.PLAIN}
SIDES = ("qkv", "gate_up", "o", "down")
LLAMA_8B = dict(hidden=4096, inter=14336, nq=32, nk=8, d=128)
TINY = dict(hidden=64, inter=96, nq=4, nk=2, d=32)


class Case:
    """One layer's worth of inputs for both fused kernels, LAYERS weight copies of each."""

    def __init__(self, shape, layers, dev, dtype):
        h, i, nq, nk, d = (shape[k] for k in ("hidden", "inter", "nq", "nk", "d"))
        self.shape, self.layers = shape, layers
        g = torch.Generator(device=dev).manual_seed(0)

        def rand(*s, scale=1.0):
            return (torch.randn(*s, generator=g, device=dev) * scale).to(dtype)

        self.x, self.res = rand(1, h), rand(1, h)
        self.qkv_w = [rand((nq + 2 * nk) * d, h, scale=h ** -0.5) for _ in range(layers)]
        self.gate_up_w = [rand(2 * i, h, scale=h ** -0.5) for _ in range(layers)]
        self.norm = RMSNorm(h, eps=1e-5).to(dev, dtype)
        self.rope = RotaryEmbedding(d, d, 8192, 500000.0, True)
        self.positions = torch.tensor([700], device=dev)
        self.table, self.table_row = self.rope.table_rows(self.positions)
        self.slot = torch.tensor([16 * 5 + 3], device=dev)
        self.caches = [(torch.zeros(64, 16, nk, d, device=dev, dtype=dtype),
                        torch.zeros(64, 16, nk, d, device=dev, dtype=dtype)) for _ in range(layers)]
        self.act = SiluAndMul()
        self.o_w = [rand(h, nq * d, scale=(nq * d) ** -0.5) for _ in range(layers)]
        self.down_w = [rand(h, i, scale=i ** -0.5) for _ in range(layers)]
        self.attn_out, self.act_in = rand(1, nq * d), rand(1, i)
        self.weight_bytes = {side: w[0].numel() * w[0].element_size() for side, w in
                             (("qkv", self.qkv_w), ("gate_up", self.gate_up_w), ("o", self.o_w), ("down", self.down_w))}

    # ---- the three ways of computing each side -----------------------------------------------
    def qkv(self, way, layer):
        s, w = self.shape, self.qkv_w[layer]
        kc, vc = self.caches[layer]
        if way == "cublas":
            return torch.nn.functional.linear(self.x, w)
        if way == "unfused":
            normed, _ = self.norm(self.x, self.res)
            qkv = torch.nn.functional.linear(normed, w)
            q, k, v = qkv.split([s["nq"] * s["d"], s["nk"] * s["d"], s["nk"] * s["d"]], dim=-1)
            q, k = self.rope(self.positions, q, k)
            store_kv_cache_triton(k.view(1, s["nk"], s["d"]), v.view(1, s["nk"], s["d"]), kc, vc, self.slot)
            return q
        return fused_gemv.norm_gemv_rope_kv(self.x, self.res, self.norm.weight, 1e-5, w, self.table, self.table_row,
                                            self.slot, kc, vc, s["nq"], s["nk"], s["d"])[0]

    def o(self, way, layer):  # no fusion: cuBLAS against the same GEMV kernel ("unfused" = cuBLAS)
        if way == "fused":
            return fused_gemv.gemv(self.attn_out, self.o_w[layer])
        return torch.nn.functional.linear(self.attn_out, self.o_w[layer])

    def down(self, way, layer):
        if way == "fused":
            return fused_gemv.gemv(self.act_in, self.down_w[layer])
        return torch.nn.functional.linear(self.act_in, self.down_w[layer])

    def gate_up(self, way, layer):
        w = self.gate_up_w[layer]
        if way == "cublas":
            return torch.nn.functional.linear(self.x, w)
        if way == "unfused":
            normed, _ = self.norm(self.x, self.res)
            return self.act(torch.nn.functional.linear(normed, w))
        return fused_gemv.norm_gemv_silu_mul(self.x, self.res, self.norm.weight, 1e-5, w)[0]


def rel_err(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tiny-cpu", action="store_true")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--tma", action="store_true", help="also the TMA tiles (TMA_TILES)")
    args = p.parse_args()
    dev = torch.device("cpu" if args.tiny_cpu else "cuda")
    dtype = torch.float32 if args.tiny_cpu else torch.bfloat16
    case = Case(TINY if args.tiny_cpu else LLAMA_8B, 2 if args.tiny_cpu else args.layers, dev, dtype)
    result = sweep(case, dev, tiles=TILES + TMA_TILES if args.tma else TILES)
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "fused_gemv.json").write_text(json.dumps(result, indent=1))
    print(markdown(result))


def sweep(case: "Case", dev, rounds: int = 30, tiles=None) -> dict:
    """Checks every fused tile against the unfused chain, then times every way and tile side by
    side (graph_timing's amortised method: LAYERS calls per graph, interleaved rounds, L2 flushed
    before each replay) and reads each graph's kernels from the profiler. Leaves
    ``fused_gemv.GPU_TILES`` at the fastest tile per kernel kind (o and down share one: the
    fastest by their summed time); unchanged when nothing was timed (off the GPU)."""
    defaults = {k: dict(v) for k, v in fused_gemv.GPU_TILES.items()}
    result = {"copy_tbps": None, "rows": [], "best_tiles": None,
              "default_tiles": {side: defaults[e] for side, e in EPILOGUE_OF.items()}}
    tiles = (tiles or TILES) if dev.type == "cuda" else TILES[:1]
    runners, rows = {}, {}
    for side in SIDES:
        fn = getattr(case, side)
        want = fn("unfused", 0)
        plain = side in ("o", "down")  # nothing to fuse: the unfused chain is cuBLAS itself
        epilogue = EPILOGUE_OF[side]
        for way, tile in [("cublas", None)] + ([] if plain else [("unfused", None)]) + [("fused", t) for t in tiles]:
            label = f"{side} {way} {json.dumps(tile, sort_keys=True) if tile else ''}".strip()
            fused_gemv.GPU_TILES[epilogue] = dict(defaults[epilogue] if tile is None else tile)  # baked into the graphs
            row = rows[label] = {"side": side, "way": way, "tile": tile}
            try:
                if way == "fused":
                    row["rel_err_vs_unfused"] = rel_err(fn(way, 0), want)
                    compiled = fused_gemv.LAST_LAUNCH.get("kernel")
                    row["registers"] = getattr(compiled, "n_regs", None)
                    row["spills"] = getattr(compiled, "n_spills", None)
                if dev.type == "cuda":
                    from benchmarks.graph_timing import AmortisedGraphs

                    runners[label] = AmortisedGraphs([functools.partial(fn, way, layer) for layer in range(case.layers)])
            except Exception as exc:  # noqa: BLE001 - a tile that does not compile or run is reported, not fatal
                row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        fused_gemv.GPU_TILES[epilogue] = dict(defaults[epilogue])
    if runners:
        from fk_pytest.timing import L2Flusher, measure_roofline
        from benchmarks.graph_timing import graph_kernel_breakdown, time_amortised

        result["copy_tbps"] = measure_roofline(dev)["copy_tbps"]
        times = time_amortised(runners, L2Flusher(dev), rounds)
        for label, t in times.items():
            row = rows[label]
            row.update(us=t["us"], spread=t["spread"])
            row["fraction_of_copy"] = case.weight_bytes[row["side"]] / (t["us"] * 1e-6) / (result["copy_tbps"] * 1e12)
            row["kernel_us"] = graph_kernel_breakdown(runners[label].many)["kernel_sum_ms"] * 1e3 / case.layers
    result["rows"] = list(rows.values())
    for r in result["rows"]:
        print(json.dumps(r), flush=True)
    best = {}
    for epilogue in set(EPILOGUE_OF.values()):
        sides = [side for side, e in EPILOGUE_OF.items() if e == epilogue]
        totals = {}
        for r in result["rows"]:
            if r["way"] == "fused" and "us" in r and r["side"] in sides:
                totals.setdefault(json.dumps(r["tile"], sort_keys=True), []).append(r["us"])
        complete = {k: sum(v) for k, v in totals.items() if len(v) == len(sides)}
        if complete:
            tile = json.loads(min(complete, key=complete.get))
            fused_gemv.GPU_TILES[epilogue] = tile
            best.update({side: tile for side in sides})
    result["best_tiles"] = best or None
    return result


def markdown(result) -> str:
    lines = [f"Copy bandwidth measured in this run: {result['copy_tbps'] or 0:.2f} TB/s. Fastest fused tile per "
             f"side (o and down: one tile, by their summed time): {result['best_tiles']} (defaults "
             f"{result['default_tiles']}).", "",
             "| side | way | tile (BLOCK_K, warps, row acc., rows per half, programs per SM) | us per call | kernels us per call "
             "| weight bytes / time, of copy | registers | rel. err vs unfused |", "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        t = r["tile"]
        tile = "-" if t is None else (f"{t['BLOCK_K']}, {t['num_warps']}, {'y' if t['ROW_ACC'] else 'n'}, "
                                      f"{t.get('HALF', 'auto')}, {t.get('PER_SM', 'all')}"
                                      + (f", norm {t['NORM_BLOCK']}" if t.get("NORM_BLOCK") else "")
                                      + (f", TMA x{t['STAGES']}" if t.get("TMA") else
                                         f", x{t['STAGES']} stages" if t.get("STAGES", 1) > 1 else ""))
        cells = [r["side"], r["way"], tile, _f(r.get("us"), ".2f"), _f(r.get("kernel_us"), ".2f"),
                 _f(r.get("fraction_of_copy"), ".3f"), _f(r.get("registers"), "d"), _f(r.get("rel_err_vs_unfused"), ".2e")]
        lines.append("| " + " | ".join(cells) + " |" + (f" error: {r['error']}" if "error" in r else ""))
    return "\n".join(lines)


def _f(x, spec):
    return "-" if x is None else format(x, spec)


if __name__ == "__main__":
    main()
