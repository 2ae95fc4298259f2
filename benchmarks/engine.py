"""Our engine on Llama-3.1-8B (published config, random bf16 weights) against HF transformers'
``generate`` on the same weights, in one run on one GPU.

Measured: decode at batch 1 (prompt 128, 256 output tokens) in ms per token, wall clock and GPU
time (back-to-back replays of the batch-1 graph) and the host's share (their difference); the
floor (bytes of the weights a decode step reads / copy bandwidth measured here); batch 64 (prompt
128, 256 outputs) output tokens per second; the same for HF (eager, default cache; batch 64 with
fewer tokens, see ``--hf-batch-tokens``). Checks: greedy tokens with CUDA graphs identical to the
same padded path run eagerly (same kernels); agreement with HF's greedy tokens (prefix and
teacher-forced top-1: bf16 random weights may diverge, so it is reported, not asserted).
torch.compile + graphs runs last, in a child process killed when the run's budget is spent.

    PYTHONPATH=$PWD/src:$PWD python3 -m benchmarks engine          (device machine, repo root; <= 5 min)
    python3 -m benchmarks engine --tiny-cpu                          (a check of the script on a CPU)

Prints a table last; with ``$OUT`` set writes ``$OUT/engine.json`` and ``$OUT/engine.md``.
"""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

if "--tiny-cpu" in sys.argv:  # the fused decode's Triton kernels run in the interpreter on a CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
import transformers

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]
from kernels_reference.engine import LLM, FusedDecodeConfig, SamplingParams  # noqa: E402
from kernels_reference.ops.fused_gemv import gemv as fused_gemv  # noqa: E402
from kernels_reference.L4.llama import init_random_weights, model_for  # noqa: E402
from benchmarks.graph_timing import graph_kernel_breakdown, replay_ms  # noqa: E402

TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=500, head_dim=16)
PROMPT, OUTPUT, BIG_BATCH, BLOCK = 128, 256, 64, 16
TINY_SHAPES = (32, 40, 8)  # prompt, output, big batch on a CPU: the same flow, smaller
TOTAL_BUDGET_S = 290  # default --budget: the whole run; the compile phase gets what is left, at least MIN_COMPILE_S
MIN_COMPILE_S = 90


def main():
    args = parse_args()
    if args.decode_pdl != "off":  # the paged decode's launch variant for this whole run (child too)
        import dataclasses
        from kernels_reference.ops.paged_decode import decode as paged_decode  # DECODE_CONFIG: the runtime default
        paged_decode.DECODE_CONFIG = dataclasses.replace(paged_decode.DECODE_CONFIG, pdl=args.decode_pdl)
    t_start = time.time()
    s = Setup(args)
    if args.compile_phase:  # the child process of the compile phase
        compile_phase(s, args.ours_tokens, Path(args.compile_phase))
        return
    results = {"environment": environment(s.dev), "command": command_line(args), "runs": [], "checks": {},
               "floor": decode_floor(s.ours, s.dev, profile=args.variants)}

    # Ours: eager (reference point), then with CUDA graphs (the production path).
    llm = LLM(s.ours, **s.engine_args)
    eager = decode_run(llm, "ours eager", s.prompt, min(args.eager_tokens, s.output), s.dev)
    results["runs"].append(eager)
    del llm
    try:
        llm, build_s = timed(lambda: LLM(s.ours, **s.engine_args, **s.graphs), s.dev)
        run1 = decode_run(llm, s.graphs_name, s.prompt, s.output, s.dev, build_s=build_s)
        run64 = batch_run(llm, s.graphs_name, s.batch, s.output, s.dev)
        del llm
    except RuntimeError as e:  # e.g. the engine's replay check refused an uncapturable attention
        results["checks"]["graphs_error"] = str(e)[:500]
        print(f"CUDA graphs failed: {e}", flush=True)
        run1 = decode_run(LLM(s.ours, **s.engine_args), "ours eager", s.prompt, s.output, s.dev)
        run64 = batch_run(LLM(s.ours, **s.engine_args), "ours eager", s.batch, s.output, s.dev)
    results["runs"] += [run1, run64]
    ours_tokens = run1.pop("tokens")
    results["checks"]["graphs_vs_eager_prefix"] = common_prefix(ours_tokens, eager.pop("tokens"))
    padded = LLM(s.ours, **s.engine_args, padded_decode=True)  # the graphs' kernels and shapes, no replay
    same = padded.generate([s.prompt], SamplingParams(max_tokens=min(args.eager_tokens, s.output)))[0]
    results["checks"]["graphs_identical_to_padded_eager"] = same == ours_tokens[:len(same)]
    del padded
    write(results, args)
    if args.gemv_sweep:  # the fused GEMVs' tiles at these shapes; leaves the fastest in place
        from benchmarks.fused_gemv import LLAMA_8B, TINY as TINY_GEMV, Case, markdown as gemv_markdown, sweep

        case = Case(TINY_GEMV if args.tiny_cpu else LLAMA_8B, 2 if args.tiny_cpu else 8, s.dev,
                    torch.float32 if args.tiny_cpu else torch.bfloat16)
        results["fused_gemv"] = sweep(case, s.dev)
        print(gemv_markdown(results["fused_gemv"]), flush=True)
        del case
        empty_cache(s.dev)
    if args.variants:  # batch-1 decode: module path vs fused decode, each without and with PDL
        variant_runs(s, ours_tokens, results, experiments=args.experiments)
        write(results, args)

    if args.no_hf:
        results["seconds"] = round(time.time() - t_start, 1)
        write(results, args)
        print(markdown(results))
        return
    # HF transformers generate, eager, default cache.
    hf1, hf_tokens = hf_decode_run(s.hf, s.prompt, min(args.hf_tokens, s.output), s.dev)
    hf64 = hf_batch_run(s.hf, s.batch, min(args.hf_batch_tokens, s.output), s.dev)
    results["runs"] += [hf1, hf64]
    scorer = LLM(s.ours, **s.engine_args)
    forced = scorer.score([s.prompt + hf_tokens], [len(s.prompt)])[0]
    del scorer
    n = min(len(hf_tokens), len(ours_tokens))
    results["checks"]["hf_agreement"] = {
        "tokens": n, "greedy_common_prefix": common_prefix(ours_tokens[:n], hf_tokens[:n]),
        "greedy_same_position": sum(a == b for a, b in zip(ours_tokens, hf_tokens)) / n,
        "teacher_forced_top1": sum(a == b for a, b in zip(forced, hf_tokens)) / len(hf_tokens)}
    write(results, args)

    # torch.compile + graphs, last and in a child process with a time limit: how long Dynamo and
    # Inductor take on 32 layers depends on how often the attention's metadata makes it recompile.
    if args.no_compile:
        results["compile"] = "skipped (--no-compile)"
    else:
        del s  # the child builds its own copy of the weights
        empty_cache(torch.device("cpu" if args.tiny_cpu else "cuda"))
        limit = max(MIN_COMPILE_S, args.budget - (time.time() - t_start))
        results["compile"], child = run_compile_child(args, ours_tokens, limit)
        results["runs"] += child.get("runs", [])
        results["checks"].update(child.get("checks", {}))
    results["seconds"] = round(time.time() - t_start, 1)
    write(results, args)
    print(markdown(results))


class Setup:
    """The models (HF's and ours with the same weights), the prompts and the engine arguments."""

    def __init__(self, args):
        self.dev = torch.device("cpu" if args.tiny_cpu else "cuda")
        prompt_len, self.output, big_batch = TINY_SHAPES if args.tiny_cpu else (PROMPT, OUTPUT, BIG_BATCH)
        config = hf_config(args.tiny_cpu)
        self.hf = hf_model(config, self.dev)
        with torch.device(self.dev):
            self.ours = model_for(config).to(torch.bfloat16).eval()
        self.ours.load_weights(self.hf.state_dict().items())  # the same weights, by HF checkpoint names
        gen = torch.Generator().manual_seed(0)
        self.prompt = torch.randint(0, config.vocab_size, (prompt_len,), generator=gen).tolist()
        self.batch = [torch.randint(0, config.vocab_size, (prompt_len,), generator=gen).tolist()
                      for _ in range(big_batch)]
        self.engine_args = dict(num_blocks=big_batch * -(-(prompt_len + self.output) // BLOCK) + 64,
                                block_size=BLOCK, max_num_seqs=big_batch, max_num_batched_tokens=4096,
                                max_model_len=prompt_len + self.output)
        # No CUDA graphs on a CPU: the same padded static-buffer path, run eagerly.
        self.graphs = {"padded_decode": True} if args.tiny_cpu else {"cuda_graphs": True}
        self.graphs_name = "ours padded decode (no graphs on CPU)" if args.tiny_cpu else "ours + CUDA graphs"
        self.compile_options = {"backend": "aot_eager"} if args.tiny_cpu else True  # Inductor's C++ is slow on CPUs


# Batch-1 variants: (label, the engine's fused_decode argument, the paged decode's PDL mode). Session
# 5 also ran FusedDecodeConfig(mlp=False, linear=False), (mlp=False), (linear=False, pdl=False),
# (pdl=False) and (gate_up="cublas") this way (docs/perf/h200-engine.md, runs e-n).
# An optional fourth element fixes the fused GEMVs' tiles ({kind: tile}, fused_gemv.GPU_TILES) for that
# variant's graph; without it the variant runs with GPU_TILES as they are (after --gemv-sweep: its picks).
DEFAULT_TILES = {k: dict(v) for k, v in fused_gemv.GPU_TILES.items()}  # the committed defaults, as imported
_KINDS = {"gate_up": fused_gemv.SILU_MUL, "qkv": fused_gemv.ROPE_KV, "plain": fused_gemv.PLAIN}


def _tiles(everywhere=None, **by_kind):
    """The default tiles with changes merged in: ``everywhere`` into every kind's tile, and per kind
    (gate_up, qkv, plain) into that one; a None value removes the option."""
    tiles = {}
    for name, kind in _KINDS.items():
        merged = {**DEFAULT_TILES[kind], **(everywhere or {}), **by_kind.get(name, {})}
        tiles[kind] = {k: v for k, v in merged.items() if v is not None}
    return tiles


VARIANTS = [("module path", False, "off"),
            ("fused decode (defaults)", True, "off", DEFAULT_TILES),
            ("fused decode, next kernel launched at once (run s defaults)", True, "off",
             _tiles(everywhere=dict(LATE_TRIGGER=False))),
            ("fused decode, GPU_TILES as they stand (with --gemv-sweep: its picks)", True, "off")]


# Commits 149a3b4..921bd58 (2026-12-01; docs/perf/h200-engine.md runs q, r): the pipelined tiles (cp.async through shared
# memory) that won the isolated sweep lost inside the engine, almost all on o/down and only with
# PDL. Run t (--experiments pipelined): the same tiles with the late trigger (the default since).
PIPE = dict(gate_up=dict(BLOCK_K=256, STAGES=6, PER_SM=None), qkv=dict(BLOCK_K=256, HALF=8, STAGES=4),
            plain=dict(BLOCK_K=256, STAGES=6, num_warps=4))
PIPELINED_EXPERIMENTS = [
    ("fused, pipelined tiles everywhere, late trigger", True, "off", _tiles(**PIPE)),
    ("fused, pipelined gate/up and q/k/v, late trigger", True, "off", _tiles(gate_up=PIPE["gate_up"], qkv=PIPE["qkv"])),
    ("fused, pipelined gate/up only, late trigger", True, "off", _tiles(gate_up=PIPE["gate_up"])),
    ("fused, pipelined o/down only, late trigger", True, "off", _tiles(plain=PIPE["plain"]))]


# Run v (--experiments): with the late trigger, tiles picked in the engine rather than by the
# isolated sweep (which has no dependent launches): one kind's tile changed at a time.
EXPERIMENTS = [("fused, q/k/v 8 rows per half", True, "off", _tiles(qkv=dict(HALF=8))),
               ("fused, q/k/v 1024 columns, 8 warps", True, "off", _tiles(qkv=dict(BLOCK_K=1024, num_warps=8))),
               ("fused, gate/up 4 programs per SM", True, "off", _tiles(gate_up=dict(PER_SM=4))),
               ("fused, gate/up one program per row group", True, "off", _tiles(gate_up=dict(PER_SM=None))),
               ("fused, gate/up 4 rows per half", True, "off", _tiles(gate_up=dict(HALF=4))),
               ("fused, o/down 512 columns, 4 warps", True, "off", _tiles(plain=dict(BLOCK_K=512, num_warps=4))),
               ("fused, o/down 4 programs per SM", True, "off", _tiles(plain=dict(PER_SM=4))),
               ("fused, o/down 8 rows per half", True, "off", _tiles(plain=dict(HALF=8)))]


def variant_runs(s: "Setup", ours_tokens, results, experiments: Optional[str] = None) -> None:
    """Batch-1 decode of the same model in each of ``VARIANTS`` (the engine's fused decode, the
    paged decode's PDL mode; an engine with only the batch-1 graph each): GPU and wall
    time per token side by side, and each variant's first decode step's logits against the module
    path's (same prompt, same prefill, so the difference is the decode step's kernels alone)."""
    import dataclasses
    from kernels_reference.ops.paged_decode import decode as paged_decode  # DECODE_CONFIG: the runtime default

    default = paged_decode.DECODE_CONFIG
    current_tiles = {k: dict(v) for k, v in fused_gemv.GPU_TILES.items()}
    reference_logits = None
    results["variants"] = []
    kept = []  # every variant's engine and caches stay alive for the interleaved replays at the end
    try:
        extra = {None: [], "tiles": EXPERIMENTS, "pipelined": PIPELINED_EXPERIMENTS}[experiments]
        for label, fused, pdl, *tiles in VARIANTS + extra:
            paged_decode.DECODE_CONFIG = dataclasses.replace(default, pdl=pdl)
            fused_gemv.GPU_TILES.clear()
            fused_gemv.GPU_TILES.update({k: dict(v) for k, v in (tiles[0] if tiles else current_tiles).items()})
            name = f"{s.graphs_name}, {label}, decode PDL {pdl}"
            print(f"variant: {name}", flush=True)
            llm, build_s = timed(lambda: LLM(s.ours, **s.engine_args, **s.graphs, graph_batch_sizes=[1],
                                             fused_decode=fused), s.dev)
            logits = first_decode_logits(llm, s.prompt)
            reference_logits = logits if reference_logits is None else reference_logits
            run = decode_run(llm, name, s.prompt, s.output, s.dev, build_s=build_s)
            tokens = run.pop("tokens")
            run["logits_rel_err_vs_module_path"] = float((logits - reference_logits).norm()
                                                         / reference_logits.norm())
            run["greedy_prefix_vs_graphs"] = common_prefix(tokens, ours_tokens)
            run["fused_gemv_tiles"] = {str(k): v for k, v in fused_gemv.GPU_TILES.items()} if fused else None
            if s.dev.type == "cuda":
                try:
                    run["kernels"] = graph_kernel_breakdown(llm.runner.decoder.graphs[1])
                except Exception as exc:  # noqa: BLE001 - a profiler problem must not lose the run
                    run["kernels_error"] = repr(exc)[:300]
            results["variants"].append(run)
            # The model's attention modules are rebound to the next engine's caches; this engine's
            # graph keeps the addresses of its own, which must stay allocated for its replays.
            kept.append((llm, [attn.kv_cache for attn in s.ours.attention_layers()]))
        if s.dev.type == "cuda":  # GPU time side by side: the variants' graphs replayed in turn
            graphs = [llm.runner.decoder.graphs[1] for llm, _ in kept]
            for run, ms in zip(results["variants"], interleaved_replay_ms(graphs)):
                run["gpu_ms_interleaved"] = ms
    finally:
        paged_decode.DECODE_CONFIG = default
        fused_gemv.GPU_TILES.clear()
        fused_gemv.GPU_TILES.update(current_tiles)
        kept.clear()
        empty_cache(s.dev)


def interleaved_replay_ms(graphs, rounds: int = 30) -> list:
    """Median GPU time of each graph's replay, the graphs taking turns (order reversed every other
    round), so clock and temperature drift over the run reach every graph alike."""
    events = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(rounds)]
              for _ in graphs]
    for g in graphs:
        g.replay()
    for r in range(rounds):
        order = range(len(graphs)) if r % 2 == 0 else reversed(range(len(graphs)))
        for i in order:
            events[i][r][0].record()
            graphs[i].replay()
            events[i][r][1].record()
    torch.cuda.synchronize()
    return [statistics.median(a.elapsed_time(b) for a, b in evs) for evs in events]


def first_decode_logits(llm, prompt) -> torch.Tensor:
    """The logits of the first decode step after ``prompt``'s prefill (a copy)."""
    decoder, seen = llm.runner.decoder, []
    run = decoder.run
    decoder.run = lambda batch, graphs: seen.append(run(batch, graphs)[0].clone()) or seen[-1][None]
    try:
        llm.generate([prompt], SamplingParams(max_tokens=2))  # prefill, then one decode step
    finally:
        decoder.run = run
    return seen[0]


def compile_phase(s: Setup, ours_tokens_path: str, out: Path) -> None:
    """Runs and checks of the compiled engine, written to ``out`` after each run: a child killed at
    its time limit (the batch-64 shapes compile again) keeps what it finished."""
    from torch._dynamo.utils import counters

    start = time.time()
    result = {"runs": [], "checks": {}}

    def progress(what):  # on stderr, which the parent shows when it has to kill this process
        print(f"[compile child {time.time() - start:.0f} s] {what}; dynamo stats {dict(counters['stats'])}",
              file=sys.stderr, flush=True)
        result["checks"]["compile_graphs_compiled"] = counters["stats"].get("unique_graphs", None)
        out.write_text(json.dumps(result))

    del s.hf
    empty_cache(s.dev)
    name = s.graphs_name.replace("ours", "ours + compile")
    progress("building the engine (compiles and captures the decode buckets)")
    llm, build_s = timed(lambda: LLM(s.ours, **s.engine_args, **s.graphs, compile=s.compile_options), s.dev)
    progress(f"engine built in {build_s:.0f} s; batch-1 decode run")
    c1 = decode_run(llm, name, s.prompt, s.output, s.dev, build_s=build_s)
    ours_tokens = json.loads(Path(ours_tokens_path).read_text())
    result["checks"]["compile_vs_graphs_prefix"] = common_prefix(c1.pop("tokens"), ours_tokens)
    result["runs"].append(c1)
    progress("batch-64 run")
    result["runs"].append(batch_run(llm, name, s.batch, s.output, s.dev))
    progress("done")


def run_compile_child(args, ours_tokens, limit_s):
    """(status, child's results): the compile phase in a fresh process, killed after ``limit_s``."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        tokens, out = Path(tmp) / "tokens.json", Path(tmp) / "compile.json"
        tokens.write_text(json.dumps(ours_tokens))
        cmd = [sys.executable, __file__, "--compile-phase", str(out), "--ours-tokens", str(tokens)]
        cmd += ["--tiny-cpu"] if args.tiny_cpu else []
        cmd += ["--decode-pdl", args.decode_pdl]
        try:
            done = subprocess.run(cmd, timeout=limit_s, capture_output=True, text=True)
        except subprocess.TimeoutExpired as exc:  # say how far it got, keep the runs it finished
            err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            reached = [line for line in err.splitlines() if line.startswith("[compile child")]
            partial = json.loads(out.read_text()) if out.exists() else {}
            return f"not finished within {limit_s:.0f} s (killed); last progress: {reached[-1:] or err[-300:]}", partial
        if done.returncode != 0 or not out.exists():
            return f"failed (exit {done.returncode}): {done.stderr[-400:]}", {}
        return "ran", json.loads(out.read_text())


# ---- measurements -----------------------------------------------------------------------------
def decode_run(llm, name, prompt, tokens, dev, build_s=None):
    """Batch 1: ms per decode token from (T(tokens) - T(1)) / (tokens - 1), so prefill drops out."""
    # Warm-up on the timed shapes: JIT, lazy tables and the kernels' autotuning (keyed on the token
    # count) must not land in a timed call (a 16-token warm-up left the 128-token prefill untuned).
    llm.generate([prompt], SamplingParams(max_tokens=4))
    _, t_first = timed(lambda: llm.generate([prompt], SamplingParams(max_tokens=1)), dev)
    out, t_all = timed(lambda: llm.generate([prompt], SamplingParams(max_tokens=tokens)), dev)
    wall_ms = (t_all - t_first) / (tokens - 1) * 1e3
    gpu_ms = graph_gpu_ms(llm, 1, dev)
    run = {"engine": name, "batch": 1, "prompt": len(prompt), "output": tokens, "wall_ms_per_token": wall_ms,
           "gpu_ms_per_token": gpu_ms, "host_ms_per_token": None if gpu_ms is None else wall_ms - gpu_ms,
           "tokens_per_s": 1e3 / wall_ms, "tokens": out[0]}
    if build_s is not None:
        run["build_s"] = build_s
    return run


def batch_run(llm, name, prompts, tokens, dev):
    """Output tokens per second over the whole generate (prefill included) and over decode only."""
    llm.generate(prompts, SamplingParams(max_tokens=4))
    _, t_first = timed(lambda: llm.generate(prompts, SamplingParams(max_tokens=1)), dev)
    _, t_all = timed(lambda: llm.generate(prompts, SamplingParams(max_tokens=tokens)), dev)
    n = len(prompts)
    gpu_ms = graph_gpu_ms(llm, n, dev)
    return {"engine": name, "batch": n, "prompt": len(prompts[0]), "output": tokens,
            "wall_ms_per_token": (t_all - t_first) / (tokens - 1) * 1e3, "gpu_ms_per_token": gpu_ms,
            "tokens_per_s": n * tokens / t_all, "decode_tokens_per_s": n * (tokens - 1) / (t_all - t_first)}


def graph_gpu_ms(llm, size, dev, reps=50):
    """GPU time of one decode step: back-to-back replays of the bucket's graph (the buffers still
    hold the last step, which rewrites one cache slot with the same values)."""
    decoder = llm.runner.decoder
    if dev.type != "cuda" or decoder is None or size not in decoder.graphs:
        return None
    graph = decoder.graphs[size]
    return replay_ms(graph, reps)


def hf_decode_run(hf, prompt, tokens, dev):
    ids = torch.tensor([prompt], device=dev)
    hf_generate(hf, ids[:, :16], 4)
    _, t_first = timed(lambda: hf_generate(hf, ids, 1), dev)
    out, t_all = timed(lambda: hf_generate(hf, ids, tokens), dev)
    wall_ms = (t_all - t_first) / (tokens - 1) * 1e3
    return ({"engine": "HF transformers generate (eager)", "batch": 1, "prompt": len(prompt), "output": tokens,
             "wall_ms_per_token": wall_ms, "tokens_per_s": 1e3 / wall_ms}, out[0, len(prompt):].tolist())


def hf_batch_run(hf, prompts, tokens, dev):
    ids = torch.tensor(prompts, device=dev)  # equal lengths: no padding
    _, t_first = timed(lambda: hf_generate(hf, ids, 1), dev)
    _, t_all = timed(lambda: hf_generate(hf, ids, tokens), dev)
    n = len(prompts)
    return {"engine": "HF transformers generate (eager)", "batch": n, "prompt": len(prompts[0]), "output": tokens,
            "wall_ms_per_token": (t_all - t_first) / (tokens - 1) * 1e3, "tokens_per_s": n * tokens / t_all,
            "decode_tokens_per_s": n * (tokens - 1) / (t_all - t_first)}


def hf_generate(hf, ids, tokens):
    with torch.no_grad():
        return hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens, min_new_tokens=tokens,
                           do_sample=False, eos_token_id=None, pad_token_id=0)


def decode_floor(model, dev, profile: bool = False):
    """Bytes one decode step must read: every weight but the embedding table (a decode gathers a
    row of it); the KV cache (under 1% here) is left out. Floor = bytes / copy bandwidth."""
    embed = model.model.embed_tokens.weight
    tied = embed is model.lm_head.weight
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters() if tied or p is not embed)
    floor = {"weight_bytes": nbytes}
    if dev.type == "cuda":
        from fk_pytest.timing import measure_roofline

        floor.update(measure_roofline(dev))
        floor["floor_ms"] = nbytes / (floor["copy_tbps"] * 1e12) * 1e3
        floor["gemv_only_ms"], kernels = gemv_only_ms(model, dev, profile)
        if kernels:  # --variants: the GEMV-only graph's kernels too, beside the variants'
            floor["gemv_only_kernels"] = kernels
    return floor


@torch.no_grad()
def gemv_only_ms(model, dev, profile: bool = False, reps=20):
    """(ms, kernels): GPU time of a decode step's matrix-vector products alone (every linear layer
    and the LM head at one token, cuBLAS through F.linear, back to back in one CUDA graph): how
    close the library GEMVs themselves come to the bandwidth floor, apart from every other kernel;
    with ``profile`` also the graph's kernel breakdown (else None)."""
    weights = [model.lm_head.weight] + [p for n, p in model.named_parameters()
                                         if p.dim() == 2 and "embed_tokens" not in n and "lm_head" not in n]
    x = {w.shape[1]: torch.randn(1, w.shape[1], device=dev, dtype=w.dtype) for w in weights}
    graph = torch.cuda.CUDAGraph()
    torch.nn.functional.linear(x[weights[0].shape[1]], weights[0])  # cuBLAS handle set-up
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        for w in weights:
            torch.nn.functional.linear(x[w.shape[1]], w)
    ms = replay_ms(graph, reps)
    if not profile:
        return ms, None
    try:
        return ms, graph_kernel_breakdown(graph)
    except Exception as exc:  # noqa: BLE001 - a profiler problem must not lose the run
        return ms, {"error": repr(exc)[:300]}


# ---- set-up and output ------------------------------------------------------------------------
def hf_config(tiny):
    cfg = {k: v for k, v in json.loads((ROOT / "tasks/configs/llama-3.1-8b.json").read_text()).items()
           if not k.startswith("_") and k not in ("torch_dtype", "qk_norm")}
    if tiny:  # a check of this script on a CPU, not a measurement
        cfg.update(TINY)
    return transformers.LlamaConfig(**cfg)


def hf_model(config, dev):
    torch.manual_seed(0)
    with torch.device(dev):
        hf = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    init_random_weights(hf)  # the same trained-scale draw as our models get
    return hf


def timed(fn, dev):
    sync(dev)
    t = time.perf_counter()
    out = fn()
    sync(dev)
    return out, time.perf_counter() - t


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def empty_cache(dev):
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def common_prefix(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def environment(dev):
    env = {"torch": torch.__version__, "transformers": transformers.__version__, "device": str(dev)}
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        pass
    if dev.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(dev)
    return env


def command_line(args):
    flags = [f"--{name.replace('_', '-')}" + ("" if value is True else f" {value:g}" if isinstance(value, float)
                                              else f" {value}")
             for name, value in vars(args).items()
             if name not in ("compile_phase", "ours_tokens") and value not in (False, None)
             and value != _parser().get_default(name)]
    return " ".join(["PYTHONPATH=$PWD/src:$PWD python3 -m benchmarks engine"] + flags)



def fmt(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def markdown(results):
    floor = results["floor"].get("floor_ms")
    lines = ["| engine | batch | prompt | output | ms/token wall | ms/token GPU | host ms/token | "
             "wall / floor | tokens/s | decode tokens/s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results["runs"]:
        ratio = r["wall_ms_per_token"] / floor if floor and r["batch"] == 1 else None
        cells = [r["engine"], r["batch"], r["prompt"], r["output"], fmt(r["wall_ms_per_token"]),
                 fmt(r.get("gpu_ms_per_token")), fmt(r.get("host_ms_per_token"), ".3f"), fmt(ratio, ".3f"),
                 fmt(r["tokens_per_s"], ".0f"), fmt(r.get("decode_tokens_per_s"), ".0f")]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    f = results["floor"]
    if results.get("fused_gemv"):
        from benchmarks.fused_gemv import markdown as gemv_markdown

        lines += ["", "The fused decode GEMVs at these shapes (benchmarks/fused_gemv.py, same run):", "",
                  gemv_markdown(results["fused_gemv"])]
    if results.get("variants"):
        lines += ["", "Batch-1 decode variants (one run, side by side):", "",
                  "| variant | ms/token GPU, interleaved | GPU / floor | ms/token GPU, alone | ms/token wall "
                  "| first-step logits rel. err vs module path | greedy prefix vs graphs run |",
                  "|---|---|---|---|---|---|---|"]
        for r in results["variants"]:
            gpu = r.get("gpu_ms_interleaved")
            lines.append(f"| {r['engine']} | {fmt(gpu, '.3f')} | {fmt(gpu / floor if gpu and floor else None, '.3f')} "
                         f"| {fmt(r.get('gpu_ms_per_token'), '.3f')} | {fmt(r['wall_ms_per_token'], '.3f')} "
                         f"| {r['logits_rel_err_vs_module_path']:.2e} | {r['greedy_prefix_vs_graphs']} |")
    profiled = [(r["engine"], r.get("kernels")) for r in results.get("variants", [])]
    profiled.append(("the step's GEMVs alone", results["floor"].get("gemv_only_kernels")))
    for name, k in profiled:
        if not k or "top" not in k:
            continue
        lines += ["", f"Kernels of one replay, {name}: replay {k['replay_ms']:.3f} ms, kernels "
                  f"{k['kernel_sum_ms']:.3f} ms summed over {k['launches']:.0f} launches:", "",
                  "| kernel | launches | us |", "|---|---|---|"]
        lines += [f"| `{t['kernel']}` | {t['launches']:.0f} | {t['us']:.1f} |" for t in k["top"]]
    lines += ["", f"Floor: {f['weight_bytes'] / 1e9:.3g} GB of weights per decode step / "
              f"{fmt(f.get('copy_tbps'), '.2f')} TB/s copy bandwidth = {fmt(floor, '.3f')} ms per token.",
              f"The step's GEMVs alone (cuBLAS, one CUDA graph, no other kernel): "
              f"{fmt(f.get('gemv_only_ms'), '.3f')} ms per token.",
              f"Checks: {json.dumps(results['checks'])}", f"Compile: {results.get('compile')}",
              f"Environment: {json.dumps(results['environment'])}", f"Command: `{results['command']}`"]
    return "\n".join(lines)


def write(results, args):
    out = os.environ.get("OUT")
    if not out:
        return
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "engine.json").write_text(json.dumps(results, indent=1))
    (Path(out) / "engine.md").write_text(markdown(results) + "\n")


def parse_args():
    return _parser().parse_args()


def _parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tiny-cpu", action="store_true", help="tiny config on the CPU: checks the script")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile + graphs run")
    p.add_argument("--no-hf", action="store_true", help="skip HF transformers' generate")
    p.add_argument("--experiments", nargs="?", const="tiles", choices=["tiles", "pipelined"],
                   help="with --variants: also EXPERIMENTS (tiles, run v) or PIPELINED_EXPERIMENTS (run t)")
    p.add_argument("--gemv-sweep", action="store_true",
                   help="time the fused decode GEMVs' tiles (benchmarks/fused_gemv.py) first and use the fastest")
    p.add_argument("--variants", action="store_true",
                   help="batch-1 decode with the engine's fused decode off/on x the paged decode's PDL off/small-batch")
    p.add_argument("--decode-pdl", default="off", choices=["off", "merge", "all", "small-batch"],
                   help="paged decode's programmatic-dependent-launch variant (kernels_reference/ops/paged_decode)")
    p.add_argument("--budget", type=float, default=TOTAL_BUDGET_S,
                   help=f"seconds for the whole run; the compile phase gets what is left (default {TOTAL_BUDGET_S})")
    p.add_argument("--eager-tokens", type=int, default=64, help="output tokens of the eager runs")
    p.add_argument("--hf-tokens", type=int, default=OUTPUT, help="HF batch-1 output tokens")
    p.add_argument("--hf-batch-tokens", type=int, default=128, help="HF batch-64 output tokens (HF is slow)")
    p.add_argument("--compile-phase", help=argparse.SUPPRESS)  # internal: the child process's output file
    p.add_argument("--ours-tokens", help=argparse.SUPPRESS)
    return p


if __name__ == "__main__":
    main()
