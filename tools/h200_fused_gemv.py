"""The fused decode GEMVs (kernels_reference/L1/fused_gemv.py) against what they replace, at
Llama-3.1-8B's shapes, batch 1, on one GPU, side by side in one run:

* ``cublas``: the projection alone (``F.linear``, cuBLAS), the floor the fused kernel competes with;
* ``unfused``: the module chain it replaces (fused-add RMSNorm -> F.linear -> RoPE -> KV store, or
  fused-add RMSNorm -> F.linear -> SiluAndMul), the reference modules' own kernels;
* ``fused``: the fused kernel, for each GPU tile in ``TILES`` (the first is the committed default).

Each case runs LAYERS times in a row in one CUDA graph, each call on its own weight copy (as
consecutive layers do, so no call finds its weights in L2), the L2 flushed before each replay; the
table gives us per call and the weight bytes / time as a fraction of the copy bandwidth measured
in the same run. Each fused tile's output is checked against the unfused chain first.

    PYTHONPATH=$PWD/src:$PWD python3 tools/h200_fused_gemv.py      (device machine, ~1 min)
    python3 tools/h200_fused_gemv.py --tiny-cpu                     (interpreter: checks the script)
"""
import argparse
import json
import os
import sys
from pathlib import Path

if "--tiny-cpu" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]
from kernels_reference.L1 import fused_gemv  # noqa: E402
from kernels_reference.L1.kv_store import store_kv_cache_triton  # noqa: E402
from kernels_reference.L1.rms_norm import RMSNorm  # noqa: E402
from kernels_reference.L1.rotary_emb import RotaryEmbedding  # noqa: E402
from kernels_reference.L1.silu_and_mul import SiluAndMul  # noqa: E402

TILES = [dict(BLOCK_K=512, num_warps=4), dict(BLOCK_K=256, num_warps=4), dict(BLOCK_K=1024, num_warps=4),
         dict(BLOCK_K=512, num_warps=8), dict(BLOCK_K=1024, num_warps=8), dict(BLOCK_K=256, num_warps=2)]
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
        self.table = self.rope.cos_sin_table(dev) if dev.type == "cuda" else torch.cat(
            self.rope.cos_sin(self.positions, torch.float32), dim=-1).contiguous()
        self.table_row = self.positions if dev.type == "cuda" else torch.zeros(1, dtype=torch.long)
        self.slot = torch.tensor([16 * 5 + 3], device=dev)
        self.caches = [(torch.zeros(64, 16, nk, d, device=dev, dtype=dtype),
                        torch.zeros(64, 16, nk, d, device=dev, dtype=dtype)) for _ in range(layers)]
        self.act = SiluAndMul()
        self.weight_bytes = {"qkv": self.qkv_w[0].numel() * self.qkv_w[0].element_size(),
                             "gate_up": self.gate_up_w[0].numel() * self.gate_up_w[0].element_size()}

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

    def gate_up(self, way, layer):
        w = self.gate_up_w[layer]
        if way == "cublas":
            return torch.nn.functional.linear(self.x, w)
        if way == "unfused":
            normed, _ = self.norm(self.x, self.res)
            return self.act(torch.nn.functional.linear(normed, w))
        return fused_gemv.norm_gemv_silu_mul(self.x, self.res, self.norm.weight, 1e-5, w)[0]


def time_us(fn, layers, dev):
    """Per-call GPU time of ``fn(layer)`` for every layer in a row, from one CUDA graph."""
    from fk_pytest.timing import L2Flusher, flushed_replay_us
    from kernels_reference.cuda_graphs import capture

    for layer in range(layers):
        fn(layer)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with capture(graph):
        for layer in range(layers):
            fn(layer)
    return flushed_replay_us(graph, L2Flusher(dev), tries=7) / layers


def rel_err(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tiny-cpu", action="store_true")
    p.add_argument("--layers", type=int, default=8)
    args = p.parse_args()
    dev = torch.device("cpu" if args.tiny_cpu else "cuda")
    dtype = torch.float32 if args.tiny_cpu else torch.bfloat16
    case = Case(TINY if args.tiny_cpu else LLAMA_8B, 2 if args.tiny_cpu else args.layers, dev, dtype)
    result = sweep(case, dev)
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "fused_gemv.json").write_text(json.dumps(result, indent=1))
    print(markdown(result))


def sweep(case: "Case", dev) -> dict:
    """Checks and times every way and tile; leaves ``fused_gemv.GPU_TILE`` at the fastest tile by
    the sum of both sides' times (the default again when none beats it, or off the GPU)."""
    result = {"copy_tbps": None, "rows": [], "best_tile": None, "default_tile": dict(fused_gemv.GPU_TILE)}
    if dev.type == "cuda":
        from fk_pytest.timing import measure_roofline

        result["copy_tbps"] = measure_roofline(dev)["copy_tbps"]
    default = dict(fused_gemv.GPU_TILE)
    totals = {}
    for side in ("qkv", "gate_up"):
        fn = getattr(case, side)
        want = fn("unfused", 0)
        ways = [("cublas", None), ("unfused", None)] + [("fused", t) for t in (TILES if dev.type == "cuda" else TILES[:1])]
        for way, tile in ways:
            if tile is not None:
                fused_gemv.GPU_TILE = dict(tile)
            row = {"side": side, "way": way, "tile": tile}
            try:
                if way == "fused":
                    row["rel_err_vs_unfused"] = rel_err(fn(way, 0), want)
                if dev.type == "cuda":
                    row["us"] = time_us(lambda layer: fn(way, layer), case.layers, dev)
                    row["fraction_of_copy"] = case.weight_bytes[side] / (row["us"] * 1e-6) / (result["copy_tbps"] * 1e12)
                    if way == "fused":
                        key = json.dumps(tile, sort_keys=True)
                        totals[key] = totals.get(key, 0.0) + row["us"]
            except Exception as exc:  # noqa: BLE001 - a tile that does not compile or run is reported, not fatal
                row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            result["rows"].append(row)
            print(json.dumps(row), flush=True)
    fused_gemv.GPU_TILE = default
    complete = {k: v for k, v in totals.items()
                if sum(1 for r in result["rows"] if r["way"] == "fused" and "us" in r
                       and json.dumps(r["tile"], sort_keys=True) == k) == 2}
    if complete:
        best = min(complete, key=complete.get)
        fused_gemv.GPU_TILE = json.loads(best)
        result["best_tile"] = json.loads(best)
    return result


def markdown(result) -> str:
    lines = [f"Copy bandwidth measured in this run: {result['copy_tbps'] or 0:.2f} TB/s. Best fused tile "
             f"(both sides' time summed): {result['best_tile']} (default {result['default_tile']}).", "",
             "| side | way | tile | us per call | weight bytes / time, fraction of copy | rel. err vs unfused |",
             "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        tile = "-" if r["tile"] is None else f"BLOCK_K {r['tile']['BLOCK_K']}, {r['tile']['num_warps']} warps"
        us = r.get("us")
        frac = r.get("fraction_of_copy")
        err = r.get("rel_err_vs_unfused")
        lines.append(f"| {r['side']} | {r['way']} | {tile} | {'-' if us is None else f'{us:.2f}'} | "
                     f"{'-' if frac is None else f'{frac:.3f}'} | {'-' if err is None else f'{err:.2e}'} |"
                     + (f" error: {r['error']}" if "error" in r else ""))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
