"""RMSNorm's wide-row launch forms against Inductor, side by side on the GPU.

The fused-add RMSNorm at 4096 wide trailed Inductor's looped two-pass reduction by 3-4% on the
H200 (docs/perf/h200-peers.md). For each case below every launch form of
``kernels_reference.L1.rms_norm`` is checked against the float64 definition and timed in one
interleaved loop (amortised CUDA graphs, L2 flushed, a fresh input set per call) beside
``torch.compile(forward_native)``: the whole row in registers (``CHUNK`` 0, the shipped configs)
and the looped form (``CHUNK`` 512-2048), each with 2-16 warps, plus what the autotuner picks with
and without ``--looped`` among its choices. Then the peer benchmark's own rms_norm
comparison runs with ``LOOPED_CONFIGS`` set to ``--looped`` (the fused-add cases, and ``--peers-k``).

    python3 -m benchmarks rms_norm_variants [--rounds 30] [--looped 1024:4,2048:8]
"""
import argparse
import functools
import io
import json
import os

import torch

import kernels_reference.L1.rms_norm as rms
from benchmarks.graph_timing import add_times, over_sets
from benchmarks.markdown import md_table
from fk_pytest.timing import L2Flusher

# (label, tokens, width, fused add): the task's 16384- and 8192-token prefill shapes (Llama-3.1-8B,
# Qwen3-8B), and Qwen2.5-7B's 3584 (masked columns)
CASES = (("4096 fused-add T16384", 16384, 4096, True), ("4096 fused-add T8192", 8192, 4096, True),
         ("4096 plain T16384", 16384, 4096, False), ("3584 fused-add T16384", 16384, 3584, True))
SETS = 6  # input sets per case: each call of the K-call graph reads bytes no other call left in L2


def _configs(block):
    import triton
    whole = [c for c in rms._configs_for_block(block) if c.kwargs.get("CHUNK", 0) == 0]
    looped = [triton.Config({"ROWS": 1, "CHUNK": c}, num_warps=w, num_stages=1)
              for c in (512, 1024, 2048) for w in (2, 4, 8, 16) if c < block and c // (32 * w) >= 1]
    return whole + looped


def _label(cfg):
    return f"rows={cfg.kwargs['ROWS']} chunk={cfg.kwargs.get('CHUNK', 0)} warps={cfg.num_warps}"


def _rel_err(out, truth):
    return float((out.double() - truth).norm() / truth.norm())


def _autotuned_pick(m, inputs, looped):
    """The config a fresh autotuner picks for these inputs with ``looped`` as LOOPED_CONFIGS (tuned
    here, outside capture, then launched by name so the timed graphs hold that config)."""
    import triton
    rms.LOOPED_CONFIGS = looped
    rms._tuned_rms_norm.cache_clear()
    tuned = rms._tuned_rms_norm(triton.next_power_of_2(m.hidden_size))
    rms.rms_norm_rows(m, *inputs)
    torch.cuda.synchronize()
    return tuned.best_config


def time_case(tokens, width, fused, looped, rounds, flush):
    import triton
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    m = rms.RMSNorm(width, 1e-5).to(dev, torch.bfloat16)
    with torch.no_grad():
        m.weight.copy_(1 + 0.1 * torch.randn(width, generator=g, device=dev))
    sets = [(torch.randn(tokens, width, generator=g, device=dev).to(torch.bfloat16),
             torch.randn(tokens, width, generator=g, device=dev).to(torch.bfloat16) if fused else None)
            for _ in range(SETS)]
    m64 = rms.RMSNorm(width, 1e-5).to(dev, torch.float64)
    with torch.no_grad():
        m64.weight.copy_(m.weight.double())
        x0, r0 = sets[0]
        truth = m64.forward_native(x0.double(), None if r0 is None else r0.double())
    truth = truth if isinstance(truth, tuple) else (truth,)

    impls, rows, runners = {}, {}, {}
    for cfg in _configs(triton.next_power_of_2(width)):
        impls[_label(cfg)] = functools.partial(rms.rms_norm_rows, config=cfg)
    for name, setting in (("autotuned (whole rows only)", ()), ("autotuned (+ looped)", looped)):
        cfg = _autotuned_pick(m, sets[0], setting)
        rows[name] = {"picked": _label(cfg)}
        impls[name] = functools.partial(rms.rms_norm_rows, config=cfg)
    compiled = torch.compile(m.forward_native, dynamic=False)
    impls["inductor"] = lambda mod, x, r: compiled(x, r)

    for name, fn in impls.items():
        try:
            with torch.no_grad():
                out = fn(m, *sets[0])
            out = out if isinstance(out, tuple) else (out,)
            err = max(_rel_err(o, t) for o, t in zip(out, truth))
            runners[name] = over_sets(lambda s, fn=fn: fn(m, *s), sets, SETS)
            rows.setdefault(name, {})["rel_err"] = err
        except Exception as exc:  # noqa: BLE001 - one form that does not build is a row, not the end
            rows.setdefault(name, {})["error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
    moved = tokens * width * 2 * (4 if fused else 2)
    add_times(rows, runners, flush, rounds, moved)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--looped", default="1024:4,2048:8",
                        help="chunk:warps pairs tried as LOOPED_CONFIGS in the autotuned rows and the peer run")
    parser.add_argument("--peers-k", default="fused-add", help="keyword of the rms_norm peer cases ('' : none)")
    args = parser.parse_args()
    looped = tuple(tuple(int(v) for v in p.split(":")) for p in args.looped.split(",") if p)
    out_dir = os.environ.get("OUT", ".")
    flush = L2Flusher(torch.device("cuda"))
    import torch._dynamo.config as dynamo_config
    dynamo_config.recompile_limit = max(getattr(dynamo_config, "recompile_limit", 8), 256)
    results = {}
    for label, tokens, width, fused in CASES:
        results[label] = time_case(tokens, width, fused, looped, args.rounds, flush)
        print(f"{label}: done", flush=True)
    with open(os.path.join(out_dir, "rms_norm_variants.json"), "w") as f:
        json.dump({"looped": looped, "cases": results, "gpu": torch.cuda.get_device_name()}, f, indent=1)

    peer_lines = []
    if args.peers_k:
        from fk_pytest.peers.measure import Options
        from fk_pytest.peers.run import benchmark
        for setting in ((), looped):
            rms.LOOPED_CONFIGS = setting
            rms._tuned_rms_norm.cache_clear()
            doc = benchmark(Options(torch.device("cuda"), "full"), ["rms_norm"], keyword=args.peers_k,
                            max_cases=0, progress=io.StringIO())
            for case in doc["ops"][0]["cases"]:
                impls = case["impls"]
                peer_lines.append((str(setting) if setting else "none", case["case"], impls["reference"].get("us"),
                                   impls.get("compile", {}).get("us"), case.get("ratio")))
        with open(os.path.join(out_dir, "rms_norm_variants_peers.json"), "w") as f:
            json.dump(peer_lines, f, indent=1)

    keys = ("us", "spread", "tb_s", "vs_inductor", "rel_err")
    for label, rows in results.items():
        table = [(name, *(r.get(k) for k in keys), r.get("picked", r.get("error", "")))
                 for name, r in sorted(rows.items(), key=lambda kv: kv[1].get("us", 1e9))]
        print(f"\n{label}\n" + md_table(["form", "us", "spread", "TB/s", "Inductor / form", "rel err", "note"], table,
                                         ["", ".2f", ".3f", ".2f", ".3f", ".1e", ""]))
    if peer_lines:
        print("\n" + md_table(["LOOPED_CONFIGS", "case", "reference us", "Inductor us", "ratio (best peer / ref)"],
                              peer_lines, ["", "", ".2f", ".2f", ".3f"]))


if __name__ == "__main__":
    main()
