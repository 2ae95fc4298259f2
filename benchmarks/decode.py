"""Paged decode at batch 1 (and regression shapes): the two-pass kernel's fixed-cost variants and
knobs, and the one-pass kernel, against the default two-pass kernel.

    python3 -m benchmarks decode               # on the H200, from the repo root (about 2 minutes)
    python3 -m benchmarks decode --tiny-cpu    # tiny shapes, Triton interpreter, CPU wall times
    python3 -m benchmarks decode --one-pass-sweep   # also the one-pass knob sweep of the last run

Llama-3.1-8B attention (32 q heads, 8 kv heads, d 128), paged cache [blocks, 16, 8, 128] in bfloat16,
block tables shuffled. Cases: B1 C8192 (the target), B1 C2048, B1 C32768, B32 C2048, B128 C1024.

1. Checks, per case and kernel: the output against a float32 evaluation (relative L2 and max abs
   error; the new kernel must be as close as the old one, within 2x, and within 1e-2); the output of
   the timed graphs after all timing replays (the one-pass merge counters must still be zero); and
   the one-pass kernel captured once, then replayed after seq_lens and the block table changed in
   place (the CUDA-graph contract).
2. Timing, the suite's amortised method (src/fk_pytest/timing.py): per implementation a graph of one
   call and a graph of K calls, call j on its own copy of the cache (no call finds its K/V in L2),
   K so that a K-call replay lasts >= 100 us (at least 2); the L2 flushed before every replay;
   implementations interleaved round by round; per call = median over rounds of
   (K-call replay - one-call replay) / (K - 1).
3. Bandwidth: bytes = KV cache read once + q + out. The fraction is of 4.24 TB/s (the brief's H200
   copy figure) and of a device-to-device copy measured here (1 GiB, events).
4. At B1 C8192 and B1 C2048, the two-pass kernel's fixed-cost variants (``VARIANTS``: interleaved
   split tiles, PDL of the merge / of both kernels / with the metadata read before the wait, a
   register cap for one resident wave; see kernels_reference/ops/paged_decode) at the default
   knobs, and a grid of knobs (``KNOBS``: tile, warps, pipeline depth, programs per SM, register
   cap) on interleaved + PDL "all". Two of the variants also run at the other cases (regressions).
   A variant this Triton / GPU cannot run (``VariantUnavailable``) is reported as unavailable.
   With --one-pass-sweep, also the one-pass knob sweep of docs/perf/h200-decode-b1.md (all lost).
   Caveat for PDL "all" / "early-metadata": here the kernel before a call's split kernel is the
   previous call's merge kernel, which signals its dependents early; in an engine it is the KV
   store kernel, which does not, so only the launch latency would overlap there.
5. ``--blocks`` / ``--tma`` add kernel "blocks" (Triton loads / TMA bulk copies) at every case and
   their reads to the ceilings; ``--contiguous-peers`` adds production kernels (SDPA cuDNN / flash /
   efficient, compiled flex_attention) on the same K/V unpaged to the ceilings. (Reads of the same
   bytes by CUDA C++ kernels, ``--cuda-reads``, answered their question in run 22 of
   docs/perf/h200-decode-b1.md; that probe was tools/cuda_reads.py, removed after a99e3bd.)
6. ``--tiny-cpu`` also compiles the structural variants for sm_90 (tools/decode_sm90_compile.py,
   Triton's compiler without a GPU) and checks the PDL instruction order in their PTX.

Prints markdown tables last; writes $OUT/h200_decode_b1.json when OUT is set.
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


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny-cpu", action="store_true", help="tiny shapes on the CPU (Triton interpreter)")
    p.add_argument("--no-sweep", action="store_true", help="old and new default configs only")
    p.add_argument("--no-knobs", action="store_true", help="the fixed-cost variants, not the knob grid")
    p.add_argument("--ceilings", action="store_true", help="also time reading the same bytes without the attention")
    p.add_argument("--only-ceilings", action="store_true", help="the ceilings alone (no cases)")
    p.add_argument("--one-tile", action="store_true",
                   help="also the one-tile-per-split configurations (ONE_TILE) at every batch-1 case")
    p.add_argument("--blocks", action="store_true",
                   help="also kernel 'blocks' (BLOCKS_SWEEP) at every case, and its first row in the ceilings")
    p.add_argument("--tma", action="store_true",
                   help="also kernel 'blocks' with TMA loads (TMA_SWEEP) at every case, and TMA reads in the ceilings")
    p.add_argument("--contiguous-peers", action="store_true",
                   help="also, in the ceilings, production attention kernels on the same K/V stored contiguously "
                        "(SDPA flash / cuDNN / efficient, compiled flex_attention): what they reach without paging")
    p.add_argument("--one-pass-sweep", action="store_true", help="also the one-pass knob sweep (it lost last time)")
    return p.parse_args()


ARGS = parse_args()
if ARGS.tiny_cpu:
    os.environ["TRITON_INTERPRET"] = "1"  # before any Triton kernel is defined

import torch  # noqa: E402

from kernels_reference.ops.paged_decode import config as pd_config  # noqa: E402
from kernels_reference.ops.paged_decode import decode as pd_decode  # noqa: E402
from kernels_reference.ops.paged_decode import device as pd_device  # noqa: E402
from kernels_reference.ops.launch_counters import counters_left_zero  # noqa: E402
from kernels_reference.ops.paged_decode import one_pass as pd_one_pass  # noqa: E402
from fk_pytest.timing import flushed_replay_us  # noqa: E402
from benchmarks.graph_timing import over_sets, time_amortised  # noqa: E402

DEVICE = torch.device("cpu" if ARGS.tiny_cpu else "cuda")
GPU = DEVICE.type == "cuda"  # timed with CUDA graphs (else one wall-clock call each)
NQ, NK, HD, BLOCK = 32, 8, 128, 16
CASES = [(1, 8192), (1, 2048), (1, 32768), (32, 2048), (128, 1024)]
COPY_TBPS = 4.24  # H200 copy bandwidth quoted in the brief
TARGET_US = 100.0  # a K-call replay lasts at least this long
MAX_CALLS = 64
SETS_BYTES = 3 << 30  # cache copies per case, shared by all implementations
ROUNDS = 60
if ARGS.tiny_cpu:
    NQ, NK, HD = 8, 2, 64
    CASES = [(1, 200), (3, 40)]

OLD = pd_config.TWO_PASS_CONFIG
NEW = pd_config.ONE_PASS_CONFIG
ONE_PASS_SWEEP = {  # label -> changes to the one-pass default ("new") or to the two-pass one ("old")
    "1p bpi4 w4 st2 (1 tile in flight, 4/SM)": ("new", dict(num_warps=4, num_stages=2, max_splits=64)),
    "1p bpi4 w4 st5 (3/SM)": ("new", dict(num_warps=4, max_splits=64)),
    "1p bpi4 w4 st5 cap32": ("new", dict(num_warps=4)),
    "1p bpi4 w8 st2": ("new", dict(num_stages=2)),
    "1p bpi4 w8 st5 cap16": ("new", dict(max_splits=16)),
    "1p bpi4 w8 st5 cap64": ("new", dict(max_splits=64)),
    "1p bpi8 w8 st5 (2 x 64 KiB tiles, 1/SM)": ("new", dict(blocks_per_iter=8)),
    "1p bpi8 w8 st2": ("new", dict(blocks_per_iter=8, num_stages=2)),
    "1p bpi8 w4 st2": ("new", dict(blocks_per_iter=8, num_warps=4, num_stages=2)),
    "1p bpi2 w4 st5 cap64": ("new", dict(blocks_per_iter=2, num_warps=4, max_splits=64)),
    "2p fused merge": ("old", dict(fused_merge=True)),
    "2p one wave (2/SM)": ("old", dict(small_batch_programs_per_sm=2)),
}
if ARGS.tiny_cpu:
    ONE_PASS_SWEEP = {"1p bpi2 w4": ("new", dict(blocks_per_iter=2, num_warps=4)),
                      "2p fused merge": ("old", dict(fused_merge=True))}
# The two-pass kernel's fixed-cost variants, each at the default knobs (changes to OLD).
VARIANTS = {
    "2p interleaved": dict(interleaved=True),
    "2p pdl merge": dict(pdl="merge"),
    "2p pdl all": dict(pdl="all"),
    "2p il pdl-all": dict(interleaved=True, pdl="all"),
    "2p il early-md": dict(interleaved=True, pdl="early-metadata"),
    "2p early-md": dict(pdl="early-metadata"),
    "2p maxnreg128": dict(max_registers=128),
    "2p pdl small-batch": dict(pdl="small-batch"),
    # The merge in the split kernel's last program (chunked since commits b7902d5..49a26cf (2026-12-01): the one-piece merge
    # spilled), i.e. one launch per call, with the split kernel itself launched dependent.
    "2p fused merge": dict(fused_merge=True),
    "2p fused merge pdl-all": dict(fused_merge=True, pdl="all"),
    "2p fused merge early-md": dict(fused_merge=True, pdl="early-metadata"),
}
EVERY_CASE = ("2p pdl merge", "2p pdl all", "2p pdl small-batch", "2p early-md")  # also timed at the other cases (regressions)
# Knobs on interleaved + PDL "all" (changes to OLD). Splits at B1 C8192 (132 SMs, 8 kv heads,
# 512 blocks): programs per SM 1/2/3/4/8 -> 17/33/50/66/128 splits (bpi 4), bpi 8 caps at 64.
# Where this Triton / GPU has no PDL, the grid runs on interleaved alone (labelled so) rather than
# being lost as unavailable rows.
PDL_MISSING = pd_device.pdl_unavailable_reason(DEVICE) if GPU else None
KNOB_BASE = dict(interleaved=True) if PDL_MISSING else dict(interleaved=True, pdl="all")
KNOBS = {
    "il+pdl st3": dict(num_stages=3),
    "il+pdl st4": dict(num_stages=4),
    "il+pdl w8 st2": dict(num_warps=8),
    "il+pdl w8 st3": dict(num_warps=8, num_stages=3),
    "il+pdl bpi8 w4 st2": dict(blocks_per_iter=8),
    "il+pdl bpi8 w8 st2": dict(blocks_per_iter=8, num_warps=8),
    "il+pdl bpi8 w8 st3": dict(blocks_per_iter=8, num_warps=8, num_stages=3),
    "il+pdl ppsm1": dict(small_batch_programs_per_sm=1),
    "il+pdl ppsm2": dict(small_batch_programs_per_sm=2),
    "il+pdl ppsm3 (one wave at 3/SM)": dict(small_batch_programs_per_sm=3),
    "il+pdl ppsm8": dict(small_batch_programs_per_sm=8),
    "il+pdl bpi2 ppsm8": dict(blocks_per_iter=2, small_batch_programs_per_sm=8),
    "il+pdl maxnreg128 (one wave at 4/SM)": dict(max_registers=128),
    "il+pdl maxnreg128 st3": dict(max_registers=128, num_stages=3),  # 72 KiB of shared memory: still 3/SM
    "il+pdl w8 maxnreg64 (4/SM)": dict(num_warps=8, max_registers=64),  # w8 compiles to 66 registers: 3/SM
    "il early-md maxnreg128": dict(pdl="early-metadata", max_registers=128),
}
if PDL_MISSING:
    KNOBS = {label.replace("il+pdl", "il (no PDL)"): change for label, change in KNOBS.items()}
SWEEP_CASES = {(1, 8192), (1, 2048), (1, 200)}  # (1, 200): --tiny-cpu
# One cache tile per split (2026-12-01, commits c18dad7..b077503): at batch 1 every program reads one tile of one kv head in
# one load step (no loop: the contiguous reads that reached 0.69-0.73 of copy in run 10 were one
# step per program), its table entries and seq_len read before the PDL wait; then the merge kernel.
# Splits = tiles: 64 programs per SM asked for, capped by the table's tiles (max_splits 512).
# num_stages 1: no cp.async staging through shared memory, whose 2 x tile footprint limits how
# many programs an SM holds. Changes to OLD.
ONE_TILE_BASE = dict(interleaved=True, pdl="early-metadata", small_batch_programs_per_sm=64, max_splits=512)
ONE_TILE = {
    "1t bpi4 w4 st1": dict(blocks_per_iter=4, num_warps=4, num_stages=1),
    "1t bpi4 w4 st2": dict(blocks_per_iter=4, num_warps=4, num_stages=2),
    "1t bpi4 w8 st1": dict(blocks_per_iter=4, num_warps=8, num_stages=1),
    "1t bpi2 w4 st1": dict(blocks_per_iter=2, num_warps=4, num_stages=1),
    "1t bpi8 w4 st1": dict(blocks_per_iter=8, num_warps=4, num_stages=1),
    "1t bpi8 w8 st1": dict(blocks_per_iter=8, num_warps=8, num_stages=1),
    "1t bpi4 w4 st1 merge x4": dict(blocks_per_iter=4, num_warps=4, num_stages=1, merge_programs_per_head=4),
    "1t bpi2 w4 st1 merge x4": dict(blocks_per_iter=2, num_warps=4, num_stages=1, merge_programs_per_head=4),
    "1t bpi8 w8 st1 merge x4": dict(blocks_per_iter=8, num_warps=8, num_stages=1, merge_programs_per_head=4),
    "1t bpi4 w4 st1 no PDL": dict(blocks_per_iter=4, num_warps=4, num_stages=1, pdl="off"),
    # Not one tile per split: today's split count (66 at B1 C8192, 2 tiles each) without staging.
    "2p il early-md st1": dict(num_stages=1, small_batch_programs_per_sm=4, max_splits=128),
}
# Kernel "blocks" (2026-12-01, commits c18dad7..b077503, kernels_reference/ops/paged_decode/blocks.py): whole cache blocks per
# program, every head. Runs 12/14 swept an earlier block-diagonal math (commit c18dad7;
# docs/perf/h200-decode-b1.md has that sweep's rows). ppsm: programs per SM asked for (splits at B1 C8192: ppsm 4 -> 512 one-step splits,
# 2 -> 256, 1 -> 128). The merge spread 4 programs per head unless said. Changes to BLOCKS_BASE.
BLOCKS_BASE = dict(kernel="blocks", blocks_per_iter=1, num_warps=4, num_stages=1, pdl="early-metadata",
                   small_batch_programs_per_sm=4, programs_per_sm=2, max_splits=512, merge_programs_per_head=4)
BLOCKS_SWEEP = {
    # Commits c18dad7..b077503 (2026-12-01), run 18 (K/V loads head-major since run 17; the token-major + permute rows of runs
    # 17-18: commit cfac1aa): pipelined through shared memory. ppsm 1 = 128 splits at B1 C8192;
    # max_splits 64 = 8 steps each. sm_90 compile: 8 warps 166 registers, 160 KiB shared memory at 3
    # stages, 224 KiB at 4; 16 warps 97 registers. Runs 15-16's rows: commits 3e53198, 3178a68.
    "blk hm w8 st3 ppsm1": dict(num_warps=8, num_stages=3, small_batch_programs_per_sm=1),
    "blk hm w8 st4 ppsm1": dict(num_warps=8, num_stages=4, small_batch_programs_per_sm=1),
    "blk hm w8 st3 64 splits": dict(num_warps=8, num_stages=3, small_batch_programs_per_sm=1, max_splits=64),
    "blk hm w8 st4 64 splits": dict(num_warps=8, num_stages=4, small_batch_programs_per_sm=1, max_splits=64),
    "blk hm w16 st3 ppsm1": dict(num_warps=16, num_stages=3, small_batch_programs_per_sm=1),
    "blk hm w8 st3 ppsm1 merge x1": dict(num_warps=8, num_stages=3, small_batch_programs_per_sm=1,
                                         merge_programs_per_head=1),
    "blk hm w8 st3 ppsm1 pdl all": dict(num_warps=8, num_stages=3, small_batch_programs_per_sm=1, pdl="all"),
    "blk hm w8 st3 ppsm1 no PDL": dict(num_warps=8, num_stages=3, small_batch_programs_per_sm=1, pdl="off"),
    "blk hm w8 st3 ppsm2": dict(num_warps=8, num_stages=3, small_batch_programs_per_sm=2),
    "blk hm w8 st1 ppsm2": dict(num_warps=8, small_batch_programs_per_sm=2),
}
BLOCKS_EVERY_CASE = ("blk hm w8 st3 ppsm1", "blk hm w8 st4 64 splits")
# Commits acf7a40..5f2d7ae (2026-12-01): kernel "blocks" with K/V brought in by TMA bulk copies (kv_loads="tma"), one whole block
# of K and one of V per copy, head-major through a permuted-stride descriptor. sm_90 compile (Triton
# 3.9): 8 warps 184-200 registers; shared memory 96 KiB at 2 stages (one K/V buffer), 160 at 3, 224
# at 4. 4 warps spill. Changes to BLOCKS_BASE; "blk hm w8 st3 ppsm1" above is the same kernel with
# Triton loads.
TMA_SWEEP = {
    "tma w8 st3 ppsm1": dict(kv_loads="tma", num_warps=8, num_stages=3, small_batch_programs_per_sm=1),
    "tma w8 st4 ppsm1": dict(kv_loads="tma", num_warps=8, num_stages=4, small_batch_programs_per_sm=1),
    "tma w8 st2 ppsm1": dict(kv_loads="tma", num_warps=8, num_stages=2, small_batch_programs_per_sm=1),
    "tma w8 st3 64 splits": dict(kv_loads="tma", num_warps=8, num_stages=3, small_batch_programs_per_sm=1,
                                 max_splits=64),
    "tma w8 st4 64 splits": dict(kv_loads="tma", num_warps=8, num_stages=4, small_batch_programs_per_sm=1,
                                 max_splits=64),
    "tma w8 st4 32 splits": dict(kv_loads="tma", num_warps=8, num_stages=4, small_batch_programs_per_sm=1,
                                 max_splits=32),
    "tma w8 st3 ppsm2": dict(kv_loads="tma", num_warps=8, num_stages=3, small_batch_programs_per_sm=2),
    "tma w8 st3 ppsm1 pdl all": dict(kv_loads="tma", num_warps=8, num_stages=3, small_batch_programs_per_sm=1,
                                     pdl="all"),
    "tma w8 st3 ppsm1 no PDL": dict(kv_loads="tma", num_warps=8, num_stages=3, small_batch_programs_per_sm=1,
                                    pdl="off"),
    "tma w8 st4 ppsm1 merge x1": dict(kv_loads="tma", num_warps=8, num_stages=4, small_batch_programs_per_sm=1,
                                      merge_programs_per_head=1),
}
TMA_EVERY_CASE = ("tma w8 st3 ppsm1", "tma w8 st4 64 splits")


def blocks_config(label):
    return dataclasses.replace(OLD, **{**BLOCKS_BASE, **{**BLOCKS_SWEEP, **TMA_SWEEP}[label]})


ONE_TILE_EVERY_CASE = ("1t bpi4 w4 st1", "1t bpi4 w4 st1 merge x4")  # also at B32 / B128 (regressions)


# ---- inputs --------------------------------------------------------------------------------------

def make_sets(batch, context, count, seed=0):
    """``count`` input sets: set 0 random, the others copies of it in their own memory (so a call
    on set j never finds set j-1's K/V in L2, and every call's output equals set 0's)."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    per_seq = -(-context // BLOCK)
    blocks = batch * per_seq + 2
    tables = torch.randperm(blocks, generator=g, device=DEVICE)[: batch * per_seq].view(batch, per_seq)
    first = {
        "q": torch.randn(batch, NQ, HD, generator=g, device=DEVICE).to(torch.bfloat16),
        "k": torch.randn(blocks, BLOCK, NK, HD, generator=g, device=DEVICE).to(torch.bfloat16),
        "v": torch.randn(blocks, BLOCK, NK, HD, generator=g, device=DEVICE).to(torch.bfloat16),
        "bt": tables.to(torch.int32).contiguous(),
        "sl": torch.full((batch,), context, dtype=torch.int32, device=DEVICE),
    }
    return [first] + [{k: v.clone() for k, v in first.items()} for _ in range(count - 1)]


def set_bytes(s):
    return sum(t.numel() * t.element_size() for t in s.values())


def decode_bytes(batch, context):
    return (2 * batch * context * NK * HD + 2 * batch * NQ * HD) * 2  # K and V once, q in, out, bf16


def reference_f32(s):
    """Float32 attention of each sequence's query over its gathered K/V (GQA by grouping heads)."""
    q, bt, sl = s["q"].float(), s["bt"].long(), s["sl"]
    batch, width = bt.shape
    ks, vs = (s[n][bt].flatten(1, 2).float() for n in "kv")  # [B, width*16, nk, d]
    qg = q.view(batch, NK, NQ // NK, HD)
    scores = torch.einsum("bkgd,btkd->bkgt", qg, ks) * HD ** -0.5
    past_end = torch.arange(width * BLOCK, device=q.device)[None, :] >= sl[:, None].long()
    scores = scores.masked_fill(past_end[:, None, None, :], float("-inf"))
    out = torch.einsum("bkgt,btkd->bkgd", torch.softmax(scores, dim=-1), vs)
    return out.reshape(batch, NQ, HD)


def errors(got, want):
    got, want = got.float(), want.float()
    rel = float(torch.linalg.vector_norm(got - want) / torch.linalg.vector_norm(want))
    return {"rel_l2": rel, "max_abs": float((got - want).abs().max()), "finite": bool(torch.isfinite(got).all())}


def decode_call(config):
    return lambda s: pd_decode.paged_decode(s["q"], s["k"], s["v"], s["bt"], s["sl"], HD ** -0.5, config=config)


# ---- timing --------------------------------------------------------------------------------------

def measured_copy_tbps():
    if not GPU:
        return None
    n = 1 << 30
    src = torch.empty(n, dtype=torch.int8, device=DEVICE).random_()
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e-3)
    del src, dst
    return 2 * n / statistics.median(times) / 1e12


# ---- checks ---------------------------------------------------------------------------------------

def check_graph_replay_new_metadata(config=None, label="one-pass"):
    """A kernel (the one-pass default, or a two-pass variant) captured at B1 C8192, replayed after
    seq_len and the block table changed in place (shorter, reshuffled), three times: each replay
    equals the float32 evaluation."""
    config = config or NEW
    name = f"graph-replay-new-metadata {label}"
    context = 8192 if GPU else 200
    s = make_sets(1, context, 1, seed=11)[0]
    want_full = reference_f32(s)
    fn = decode_call(config)
    try:
        got = fn(s)
    except pd_device.VariantUnavailable as exc:
        return {"check": name, "ok": None, "unavailable": str(exc)}
    if not GPU:
        return {"check": name, "ok": errors(got, want_full)["rel_l2"] < 1e-2}
    fn(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(s)
    worst, ok = 0.0, True
    g = torch.Generator(device=DEVICE).manual_seed(12)
    for length in (context, context // 2 + 37, 5):
        s["sl"].fill_(length)
        s["bt"].copy_(s["bt"][:, torch.randperm(s["bt"].shape[1], generator=g, device=DEVICE)])
        graph.replay()
        torch.cuda.synchronize()
        err = errors(out, reference_f32(s))
        worst = max(worst, err["rel_l2"])
        ok = ok and err["finite"] and err["rel_l2"] < 1e-2
    counters_zero = counters_left_zero("paged_decode_merge")
    return {"check": name, "ok": ok and counters_zero, "worst_rel_l2": worst, "counters_zero": counters_zero}


def check_sm90_compile():
    """--tiny-cpu: the structural variants compiled for sm_90 without a GPU (a subprocess: this
    process runs the interpreter), and the PDL order in their PTX (the test suite asserts it)."""
    import subprocess
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    run = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "decode_sm90_compile.py"), "--json"],
                         capture_output=True, text=True, env=env, timeout=900)
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    if run.returncode == 3:
        return {"check": "sm90-compile + PDL order in PTX", "ok": None, "unavailable": run.stdout.strip()[-300:]}
    for r in rows:
        print("sm_90", json.dumps(r), flush=True)
    ok = run.returncode == 0 and bool(rows) and all("error" not in r for r in rows)
    for r in rows:  # a PDL kernel reads or writes nothing before its wait (early-metadata: reads only)
        for kernel in ("split", "merge"):
            k = r.get(kernel)
            if k and k.get("launch_pdl"):
                ok = ok and k["wait"] and k["stores_before_wait"] == 0
                ok = ok and (k["loads_before_wait"] == 0 or ("early-metadata" in r["variant"] and kernel == "split"))
    if not ok:
        print(run.stderr[-3000:])
    return {"check": "sm90-compile + PDL order in PTX", "ok": ok, "variants": len(rows)}


# ---- main -----------------------------------------------------------------------------------------

def implementations(batch, context):
    impls = {"old": OLD, "new": NEW}
    if ARGS.one_tile:
        impls["2p early-md"] = dataclasses.replace(OLD, **VARIANTS["2p early-md"])
        for label, change in ONE_TILE.items():
            if batch == 1 or label in ONE_TILE_EVERY_CASE:
                impls[label] = dataclasses.replace(OLD, **{**ONE_TILE_BASE, **change})
    # kernel "blocks" (--blocks; --tma beside its Triton-loads form), with the best two-pass form
    for flag, sweep, every_case in ((ARGS.blocks, BLOCKS_SWEEP, BLOCKS_EVERY_CASE),
                                    (ARGS.tma, {"blk hm w8 st3 ppsm1": None, **TMA_SWEEP}, TMA_EVERY_CASE)):
        if flag:
            impls.setdefault("2p early-md", dataclasses.replace(OLD, **VARIANTS["2p early-md"]))
            for label in sweep:
                if batch == 1 or label in every_case or sweep[label] is None:
                    impls[label] = blocks_config(label)
    if ARGS.no_sweep:
        return impls
    sweep = (batch, context) in SWEEP_CASES
    for label, change in VARIANTS.items():
        if sweep or label in EVERY_CASE:
            impls[label] = dataclasses.replace(OLD, **change)
    if sweep and not ARGS.no_knobs:
        for label, change in KNOBS.items():
            impls[label] = dataclasses.replace(OLD, **{**KNOB_BASE, **change})
    if batch == 1 and (ARGS.one_pass_sweep or ARGS.tiny_cpu):
        for label, (base, change) in ONE_PASS_SWEEP.items():
            impls[label] = dataclasses.replace(NEW if base == "new" else OLD, **change)
    return impls


def plan(config, s):
    if config.kernel == "blocks":
        from kernels_reference.ops.paged_decode.blocks import blocks_num_splits
        return {"splits": blocks_num_splits(s["q"].shape[0], s["bt"].shape[1], pd_device.sm_count(DEVICE), config)[0],
                "resident_per_sm": None}
    if config.kernel == "one-pass":
        return pd_one_pass.one_pass_plan(s["q"], s["k"], s["bt"], config)
    return {"splits": pd_config.decode_num_splits(s["q"].shape[0], NK, s["bt"].shape[1],
                                                   pd_device.sm_count(DEVICE), config), "resident_per_sm": None}


def calls_per_graph(fn, probe, flush) -> int:
    """K, the calls per timed graph: a K-call replay lasts >= TARGET_US (from one flushed one-call
    replay of ``fn`` on ``probe``), at least 2, and K copies of the inputs fit in SETS_BYTES."""
    single = flushed_replay_us(over_sets(fn, probe, 1).one, flush)
    return max(2, min(MAX_CALLS, math.ceil(TARGET_US / single), SETS_BYTES // set_bytes(probe[0])))


def run_case(batch, context, flush, result):
    t0 = time.time()
    impls = implementations(batch, context)
    probe = make_sets(batch, context, 1)
    want = reference_f32(probe[0])
    rows = {}
    for name, cfg in impls.items():  # correctness first (compiles every kernel once)
        row = rows[name] = {"case": f"B{batch} C{context}", "impl": name, "config": dataclasses.asdict(cfg)}
        t = time.time()
        try:
            got = decode_call(cfg)(probe[0])
            row.update(errors(got, want), **plan(cfg, probe[0]))
        except pd_device.VariantUnavailable as exc:  # this Triton / GPU lacks a feature: not a failure
            row["unavailable"] = str(exc)
        except Exception as exc:  # noqa: BLE001 - a variant that fails is recorded, not fatal
            row["error"] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
        print(f"  B{batch} C{context} {name}: "
              + (f"unavailable ({row['unavailable']})" if "unavailable" in row else
                 f"ERROR {row['error'][:200]}" if "error" in row else
                 f"rel_l2 {row['rel_l2']:.2e} splits {row['splits']}")
              + f" ({time.time() - t:.1f} s)", flush=True)
    base_err = max(rows["old"].get("rel_l2", 0.0), 2 ** -9)
    for row in rows.values():
        if "unavailable" in row:
            row["ok"] = None
            continue
        row["ok"] = "error" not in row and row["finite"] and row["rel_l2"] < 1e-2 and row["rel_l2"] <= 2 * base_err
    live = {n: impls[n] for n, r in rows.items() if "error" not in r and "unavailable" not in r}
    if GPU:
        first = decode_call(live["new"] if "new" in live else next(iter(live.values())))
        calls = calls_per_graph(first, probe, flush)
        del probe
        sets = make_sets(batch, context, calls)
        runners = {}
        for name, cfg in live.items():
            try:
                runners[name] = over_sets(decode_call(cfg), sets, calls)
            except Exception as exc:  # noqa: BLE001
                rows[name]["error"] = f"capture: {type(exc).__name__}: {exc}"
                rows[name]["ok"] = False
                traceback.print_exc()
        for name, t in time_amortised(runners, flush, ROUNDS).items():
            rows[name].update(t)
            # the timed graphs after all their replays: the first and last call of the K-call graph
            r = runners[name]
            after = [errors(r.many_out[0], want), errors(r.many_out[-1], want), errors(r.one_out, want)]
            rows[name]["after_timing_rel_l2"] = max(e["rel_l2"] for e in after)
            rows[name]["ok"] = rows[name]["ok"] and rows[name]["after_timing_rel_l2"] < 1e-2
            print(f"  B{batch} C{context} {name}: {t['us']:.2f} us ({decode_bytes(batch, context) / t['us'] / 1e6 / COPY_TBPS:.2f} "
                  f"of copy) splits {rows[name].get('splits')} K {t.get('calls')} spread {t.get('spread', 0):.2f} "
                  f"after-timing rel_l2 {rows[name]['after_timing_rel_l2']:.1e}", flush=True)
        del runners, sets
        torch.cuda.empty_cache()
    else:  # the interpreter: one wall-clock call each, informational only
        for name, cfg in live.items():
            t = time.perf_counter()
            decode_call(cfg)(probe[0])
            rows[name].update({"us": (time.perf_counter() - t) * 1e6, "calls": 1, "mode": "cpu-wall"})
    nbytes = decode_bytes(batch, context)
    for row in rows.values():
        row["bytes"] = nbytes
        if "us" in row:
            row["tbps"] = nbytes / (row["us"] * 1e-6) / 1e12
            row["frac_4.24"] = row["tbps"] / COPY_TBPS
            if result.get("copy_tbps"):
                row["frac_measured_copy"] = row["tbps"] / result["copy_tbps"]
    result["rows"] += list(rows.values())
    print(f"B{batch} C{context}: {time.time() - t0:.1f} s", flush=True)


# ---- ceilings: what reading the same K/V bytes costs without the attention ---------------------

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _read_paged_kernel(k_ptr, v_ptr, bt_ptr, out_ptr, seq_len, s_block, s_tok, s_head,
                       BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, D: tl.constexpr):
    """The two-pass split kernel's reads alone: the same grid (kv head, split), split ranges,
    block-table gather and tiles, no arithmetic but a sum, no partials, no merge."""
    kv_head = tl.program_id(0)
    split = tl.program_id(1)
    splits = tl.num_programs(1)
    BPI: tl.constexpr = TILE // BLOCK_SIZE
    t = tl.arange(0, TILE)
    d = tl.arange(0, D)
    num_blocks = tl.cdiv(seq_len, BLOCK_SIZE)
    per_split = tl.cdiv(tl.cdiv(num_blocks, splits), BPI) * BPI
    start = split * per_split
    end = tl.minimum(start + per_split, num_blocks)
    acc = tl.zeros([D], tl.float32)
    for block in range(start, end, BPI):
        valid = block * BLOCK_SIZE + t < seq_len
        rows = tl.load(bt_ptr + block + t // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
        off = rows[:, None] * s_block + (t % BLOCK_SIZE)[:, None] * s_tok + kv_head * s_head + d[None, :]
        k = tl.load(k_ptr + off, mask=valid[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_ptr + off, mask=valid[:, None], other=0.0).to(tl.float32)
        acc += tl.sum(k + v, axis=0)
    tl.store(out_ptr + kv_head * splits + split, tl.sum(acc, axis=0))


@triton.jit
def _read_blocks_kernel(k_ptr, v_ptr, bt_ptr, out_ptr, seq_len, s_block,
                        BLOCK_SIZE: tl.constexpr, ROW: tl.constexpr, BLOCKS: tl.constexpr):
    """Whole cache blocks (every kv head: BLOCK_SIZE x ROW contiguous elements of K and of V) read
    through the block table, BLOCKS blocks per program in one load step, no arithmetic but a sum."""
    pid = tl.program_id(0)
    b = pid * BLOCKS + tl.arange(0, BLOCKS)
    e = tl.arange(0, BLOCK_SIZE * ROW)
    valid = (b[:, None] * BLOCK_SIZE + (e // ROW)[None, :]) < seq_len  # [blocks, elements]: token < seq_len
    rows = tl.load(bt_ptr + b, mask=b * BLOCK_SIZE < seq_len, other=0).to(tl.int64)
    off = rows[:, None] * s_block + e[None, :]
    k = tl.load(k_ptr + off, mask=valid, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + off, mask=valid, other=0.0).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(tl.sum(k + v, axis=1), axis=0))


@triton.jit
def _read_blocks_head_major_kernel(k_ptr, v_ptr, bt_ptr, out_ptr, seq_len, s_block, s_tok,
                                   BLOCK_SIZE: tl.constexpr, NKV: tl.constexpr, D: tl.constexpr):
    """One whole cache block per program, read as [kv heads, tokens, head_size] (a warp's load covers
    one kv head's rows of two tokens, 256-byte pieces): the same bytes as _read_blocks_kernel with
    BLOCKS 1, another load order."""
    pid = tl.program_id(0)
    h = tl.arange(0, NKV)[:, None, None]
    t = tl.arange(0, BLOCK_SIZE)[None, :, None]
    d = tl.arange(0, D)[None, None, :]
    row = tl.load(bt_ptr + pid).to(tl.int64)
    valid = (pid * BLOCK_SIZE + t < seq_len) & (h >= 0) & (d >= 0)
    off = row * s_block + t * s_tok + h * D + d
    k = tl.load(k_ptr + off, mask=valid, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + off, mask=valid, other=0.0).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(tl.sum(tl.sum(k + v, axis=2), axis=1), axis=0))


@triton.jit
def _read_flat_kernel(x_ptr, y_ptr, out_ptr, n, per_program, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    """Both caches' storage read contiguously, each program its own range, BLOCK elements of
    each per step (the split kernel's 32 KiB per step)."""
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    end = tl.minimum(pid * per_program + per_program, n)
    for i in tl.range(pid * per_program, end, BLOCK, num_stages=STAGES):
        m = i + offs < end
        acc += tl.load(x_ptr + i + offs, mask=m, other=0.0).to(tl.float32)
        acc += tl.load(y_ptr + i + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


@triton.jit
def _read_blocks_tma_kernel(k_desc, v_desc, bt_ptr, out_ptr, seq_len, per_program,
                            NKV: tl.constexpr, BLOCK_SIZE: tl.constexpr, D: tl.constexpr, STAGES: tl.constexpr):
    """Whole cache blocks through the table by TMA bulk copies (the descriptors of kernel "blocks"
    with kv_loads="tma": one block of K and one of V per copy, head-major), ``per_program`` blocks
    per program pipelined STAGES deep, no arithmetic but a sum; a partial last block masked."""
    pid = tl.program_id(0)
    first = pid * per_program
    end = tl.minimum(first + per_program, tl.cdiv(seq_len, BLOCK_SIZE))
    acc = tl.zeros([D], tl.float32)
    row = tl.load(bt_ptr + first, mask=first < end, other=0)
    tok = tl.arange(0, NKV * BLOCK_SIZE) % BLOCK_SIZE
    for i in tl.range(first, end, num_stages=STAGES):
        k = k_desc.load([row, 0, 0, 0]).reshape(NKV * BLOCK_SIZE, D)
        v = v_desc.load([row, 0, 0, 0]).reshape(NKV * BLOCK_SIZE, D)
        row = tl.load(bt_ptr + i + 1, mask=i + 1 < end, other=0)
        both = k.to(tl.float32) + v.to(tl.float32)
        if (i + 1) * BLOCK_SIZE > seq_len:  # the last, partial block
            both = tl.where((i * BLOCK_SIZE + tok < seq_len)[:, None], both, 0.0)
        acc += tl.sum(both, axis=0)
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


def read_blocks_tma(s, seq_len, per_program=1, stages=3, warps=4):
    from kernels_reference.ops.paged_decode.blocks import _tma_descriptors
    programs = -(-(-(-seq_len // BLOCK)) // per_program)
    out = torch.empty(programs, dtype=torch.float32, device=DEVICE)
    config = dataclasses.replace(OLD, kernel="blocks", kv_loads="tma", blocks_per_iter=1)
    k_desc, v_desc = _tma_descriptors(s["k"], s["v"], config)
    _read_blocks_tma_kernel[(programs,)](k_desc, v_desc, s["bt"], out, seq_len, per_program, NKV=NK,
                                         BLOCK_SIZE=BLOCK, D=HD, STAGES=stages, num_warps=warps)
    return out


def read_paged(s, splits, seq_len, tile=None, stages=None, warps=None):
    """``seq_len``: a host int (every set of a case has the same length; reading it from the
    device would synchronise, which graph capture forbids). ``stages`` None: Triton's default (3)."""
    out = torch.empty(NK * splits, dtype=torch.float32, device=DEVICE)
    k = s["k"]
    extra = {} if stages is None else {"num_stages": stages}
    _read_paged_kernel[(NK, splits)](k, s["v"], s["bt"], out, seq_len, k.stride(0), k.stride(1), k.stride(2),
                                     BLOCK_SIZE=BLOCK, TILE=tile or OLD.blocks_per_iter * BLOCK, D=HD,
                                     num_warps=warps or OLD.num_warps, **extra)
    return out


def read_blocks_head_major(s, seq_len, warps=8):
    programs = -(-seq_len // BLOCK)
    out = torch.empty(programs, dtype=torch.float32, device=DEVICE)
    _read_blocks_head_major_kernel[(programs,)](s["k"], s["v"], s["bt"], out, seq_len, s["k"].stride(0),
                                                s["k"].stride(1), BLOCK_SIZE=BLOCK, NKV=NK, D=HD, num_warps=warps)
    return out


def read_blocks(s, seq_len, blocks=1, warps=8):
    """Whole blocks (all kv heads, 32 KiB of K and of V each) through the table, ``blocks`` per program."""
    programs = -(-(-(-seq_len // BLOCK)) // blocks)
    out = torch.empty(programs, dtype=torch.float32, device=DEVICE)
    _read_blocks_kernel[(programs,)](s["k"], s["v"], s["bt"], out, seq_len, s["k"].stride(0),
                                     BLOCK_SIZE=BLOCK, ROW=NK * HD, BLOCKS=blocks, num_warps=warps)
    return out


def read_flat(s, programs=None, block=None, warps=None, stages=1):
    """``programs`` None: one step of ``block`` elements of each cache per program, no loop."""
    n = s["k"].numel()
    block = block or OLD.blocks_per_iter * BLOCK * HD
    programs = programs or -(-n // block)
    per_program = -(-n // programs)
    out = torch.empty(programs, dtype=torch.float32, device=DEVICE)
    _read_flat_kernel[(programs,)](s["k"], s["v"], out, n, per_program, BLOCK=block, STAGES=stages,
                                   num_warps=warps or OLD.num_warps)
    return out


def contiguous_kv(s):
    """The set's K/V gathered once into [1, kv heads, tokens, head_size] contiguous tensors (SDPA's
    preferred layout; made before capture, so the timed call reads them and nothing else)."""
    if "k_bhsd" not in s:
        used = s["bt"][0].long()
        for name in "kv":
            s[f"{name}_bhsd"] = s[name][used].flatten(0, 1)[: int(s["sl"][0])].transpose(0, 1).unsqueeze(0).contiguous()
    return s["k_bhsd"], s["v_bhsd"]


def sdpa_contiguous(backend_name):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    def call(s):
        k, v = s["k_bhsd"], s["v_bhsd"]  # contiguous_kv ran before (a KeyError here is a bug, not a peer failure)
        with sdpa_kernel([getattr(SDPBackend, backend_name)]):
            out = F.scaled_dot_product_attention(s["q"].unsqueeze(2), k, v, scale=HD ** -0.5, enable_gqa=True)
        return out.squeeze(2)
    return call


def flex_contiguous():
    from torch.nn.attention.flex_attention import flex_attention
    flex = torch.compile(flex_attention, dynamic=False)

    def call(s):
        return flex(s["q"].unsqueeze(2), s["k_bhsd"], s["v_bhsd"], scale=HD ** -0.5, enable_gqa=True).squeeze(2)
    return call


def copy_kv(s):
    """torch's own copy of both caches (reads and writes the bytes: counted twice)."""
    s.setdefault("k_copy", torch.empty_like(s["k"])).copy_(s["k"])
    s.setdefault("v_copy", torch.empty_like(s["v"])).copy_(s["v"])
    return s["k_copy"]


def time_ceilings(context, flush, result):
    """At batch 1: the default decode and the fastest variant (pdl "early-metadata") timed side by
    side with two reads of the same bytes, the split kernel's reads alone and a contiguous read
    with as many programs: how much of the decode's time any split-KV kernel of this grid would
    spend just reading (amortised, each call on its own copy, L2 flushed per replay)."""
    sets0 = make_sets(1, context, 1)
    splits = pd_config.decode_num_splits(1, NK, sets0[0]["bt"].shape[1], pd_device.sm_count(DEVICE), OLD)
    fns = {"decode: default (two-pass)": decode_call(OLD),
           "decode: pdl early-metadata": decode_call(dataclasses.replace(OLD, pdl="early-metadata")),
           "read only: the split kernel's gather": lambda s: read_paged(s, splits, context),
           "read only: contiguous, same programs": lambda s: read_flat(s, NK * splits),
           "read only: contiguous, 4x the programs": lambda s: read_flat(s, 4 * NK * splits),
           "read only: contiguous, one 16 KiB step per program (no loop)": lambda s: read_flat(s),
           "read only: contiguous, one 4 KiB step per program": lambda s: read_flat(s, None, 2048),
           "read only: contiguous, same programs, 4 KiB steps pipelined 4 deep": lambda s: read_flat(
               s, NK * splits, 2048, stages=4),
           "read only: the gather, one cache block per program": lambda s: read_paged(
               s, -(-context // BLOCK), context, tile=BLOCK),
           "read only: the gather, one 64-token tile per program": lambda s: read_paged(
               s, -(-context // (OLD.blocks_per_iter * BLOCK)), context),
           "decode: pdl early-metadata, one 64-token tile per split (up to 128 splits)": decode_call(
               dataclasses.replace(OLD, pdl="early-metadata", small_batch_programs_per_sm=16)),
           # Commits c18dad7..b077503 (2026-12-01): the gathers above ran with Triton's default 3 pipeline stages (cp.async
           # through shared memory even for one step); the same without staging, and whole blocks.
           "read only: the gather, one 64-token tile per program, stages 1": lambda s: read_paged(
               s, -(-context // (OLD.blocks_per_iter * BLOCK)), context, stages=1),
           "read only: the gather, one 32-token tile per program, stages 1": lambda s: read_paged(
               s, -(-context // (2 * BLOCK)), context, tile=2 * BLOCK, stages=1),
           "read only: the gather, one 128-token tile per program, stages 1, 8 warps": lambda s: read_paged(
               s, -(-context // (8 * BLOCK)), context, tile=8 * BLOCK, stages=1, warps=8),
           "read only: the gather, one cache block per program, stages 1": lambda s: read_paged(
               s, -(-context // BLOCK), context, tile=BLOCK, stages=1),
           "read only: the gather, whole blocks (all 8 kv heads), 1 per program": lambda s: read_blocks(s, context),
           "read only: the gather, whole blocks (all 8 kv heads), 2 per program": lambda s: read_blocks(
               s, context, blocks=2),
           "read only: the gather, whole blocks, 1 per program, loaded head-major": lambda s: read_blocks_head_major(
               s, context),
           "torch copy_ of K and V (read + write)": copy_kv}
    if ARGS.blocks:
        for label in BLOCKS_EVERY_CASE:
            fns[f"decode: {label}"] = decode_call(blocks_config(label))
    if ARGS.tma:
        fns["decode: blk hm w8 st3 ppsm1"] = decode_call(blocks_config("blk hm w8 st3 ppsm1"))
        for label in TMA_EVERY_CASE:
            fns[f"decode: {label}"] = decode_call(blocks_config(label))
        for per, stages, warps in ((1, 1, 4), (2, 3, 4), (4, 3, 4), (4, 4, 4), (8, 3, 4), (8, 4, 4), (4, 3, 8)):
            fns[f"read only: the gather, whole blocks by TMA, {per} per program, {stages} stages, {warps} warps"] = (
                lambda s, per=per, stages=stages, warps=warps: read_blocks_tma(s, context, per, stages, warps))
    if ARGS.contiguous_peers:
        for backend in ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION"):
            fns[f"peer, unpaged K/V: SDPA {backend.split('_')[0].lower()}"] = sdpa_contiguous(backend)
        fns["peer, unpaged K/V: flex_attention (compiled)"] = flex_contiguous()
    rows = []
    s0 = sets0[0]
    if ARGS.contiguous_peers:
        contiguous_kv(s0)
        want_out = reference_f32(s0)
    used = s0["bt"][0, : -(-context // BLOCK)].long()
    paged_sum = float(s0["k"][used].flatten(0, 1)[:context].double().sum()
                      + s0["v"][used].flatten(0, 1)[:context].double().sum())
    want = {"read only: the split kernel's gather": paged_sum, "read only: the gather": paged_sum,
            "read only: contiguous": float(s0["k"].double().sum() + s0["v"].double().sum())}
    for name, fn in list(fns.items()):
        try:
            got = fn(s0)  # compiles; a read kernel must have read every byte it is credited with
        except Exception as exc:  # noqa: BLE001 - one that cannot run here is recorded, the rest timed
            traceback.print_exc()
            del fns[name]
            rows.append({"case": f"B1 C{context}", "impl": name, "error": f"{type(exc).__name__}: {exc}"[:300]})
            continue
        if name.startswith("peer"):  # a production kernel: it must compute the same attention
            err = errors(got, want_out)
            if not (err["finite"] and err["rel_l2"] < 1e-2):
                del fns[name]
                rows.append({"case": f"B1 C{context}", "impl": name, "error": f"wrong output: {err}"})
            continue
        expect = next((v for prefix, v in want.items() if name.startswith(prefix)), None)
        if name.startswith("read only") and expect is None:
            raise AssertionError(f"{name}: no expected sum to check it against")
        if expect is not None and abs(float(got.double().sum()) - expect) > 1e-3 * (abs(expect) + got.numel()):
            raise AssertionError(f"{name}: sum {float(got.double().sum())} != {expect}: it does not read what it claims")
    if not GPU:
        result["ceilings"] = [{"case": f"B1 C{context}", "impl": n, "mode": "cpu: compiled and ran"} for n in fns]
        return
    calls = calls_per_graph(fns["decode: default (two-pass)"], sets0, flush)
    sets = make_sets(1, context, calls)
    if ARGS.contiguous_peers:
        for s in sets:
            contiguous_kv(s)
    runners = {}
    for n, fn in fns.items():
        try:
            runners[n] = over_sets(fn, sets, calls)
        except Exception as exc:  # noqa: BLE001 - e.g. a peer that cannot be captured: recorded, the rest timed
            traceback.print_exc()
            rows.append({"case": f"B1 C{context}", "impl": n, "error": f"capture: {type(exc).__name__}: {exc}"[:300]})
    flat_bytes = 2 * sets[0]["k"].numel() * sets[0]["k"].element_size()
    for name, t in time_amortised(runners, flush, ROUNDS).items():
        nbytes = (2 * flat_bytes if "copy_" in name else flat_bytes if name.startswith("read only: contiguous")
                  else decode_bytes(1, context))
        rows.append({"case": f"B1 C{context}", "impl": name, "us": t["us"], "spread": t.get("spread"), "calls": calls,
                     "bytes": nbytes, "frac_4.24": nbytes / (t["us"] * 1e-6) / 1e12 / COPY_TBPS, "splits": splits})
        print(f"  ceiling B1 C{context} {name}: {t['us']:.2f} us ({rows[-1]['frac_4.24']:.2f} of 4.24 TB/s)", flush=True)
    result["ceilings"] = result.get("ceilings", []) + rows
    del runners, sets
    torch.cuda.empty_cache()


def fmt(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def print_tables(result):
    rows = result["rows"]
    by_case = {}
    for r in rows:
        by_case.setdefault(r["case"], {})[r["impl"]] = r
    print("\n## Paged decode, Llama-3.1-8B heads 32/8 d128, bf16 cache, block 16 "
          f"({'amortised CUDA-graph us per call' if GPU else 'CPU interpreter wall us: no meaning'})")
    print(f"copy bandwidth: 4.24 TB/s (brief), measured here {fmt(result.get('copy_tbps'))} TB/s\n")
    if not rows:  # --only-ceilings: no cases, only the checks (and the ceilings, printed after)
        print("| check | ok |\n|---|---|")
        for c in result["checks"]:
            print(f"| {c['check']} | {status(c)} |")
        return
    print("| case | old us | new us | new frac of 4.24 TB/s | new frac of measured copy | speedup | new splits | checks |")
    print("|---|---|---|---|---|---|---|---|")
    for case, impls in by_case.items():
        old, new = impls.get("old", {}), impls.get("new", {})
        speed = old["us"] / new["us"] if "us" in old and "us" in new else None
        ok = all(impls[n].get("ok") for n in ("old", "new") if n in impls)
        print(f"| {case} | {fmt(old.get('us'))} | {fmt(new.get('us'))} | {fmt(new.get('frac_4.24'))} | "
              f"{fmt(new.get('frac_measured_copy'))} | {fmt(speed)} | {new.get('splits', '-')} | "
              f"{'ok' if ok else 'FAILED'} |")
    sweep = [r for r in rows if r["impl"] not in ("old", "new") or r["case"].startswith("B1 ")]
    if any(r["impl"] not in ("old", "new") for r in sweep):
        print("\n| case | variant | us | frac of 4.24 | splits | resident/SM | K | spread | check |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in sorted(sweep, key=lambda r: (r["case"], r.get("us", 1e9))):
            print(f"| {r['case']} | {r['impl']} | {fmt(r.get('us'))} | {fmt(r.get('frac_4.24'))} | "
                  f"{r.get('splits', '-')} | {r.get('resident_per_sm') or '-'} | {r.get('calls', '-')} | "
                  f"{fmt(r.get('spread'))} | {status(r)} |")
    checks = result["checks"]
    print("\n| check | ok |\n|---|---|")
    for c in checks:
        print(f"| {c['check']} | {status(c)} |")
    # The question of this run: the fastest correct setting per batch-1 sweep case, against the default.
    print("\n| case | fastest setting | us | frac of 4.24 TB/s | frac of measured copy | default (old) us | speedup |")
    print("|---|---|---|---|---|---|---|")
    for case, impls in by_case.items():
        timed = [r for r in impls.values() if r.get("ok") and "us" in r]
        if case not in {f"B{b} C{c}" for b, c in SWEEP_CASES} or not timed:
            continue
        old = impls.get("old", {})
        # early-metadata reads seq_len / the table before its wait (a contract on the kernel before
        # it): also name the fastest setting that is safe after any kernel
        safe = [r for r in timed if r.get("config", {}).get("pdl") != "early-metadata"]
        for label, pool in (("", timed), (" (no early-metadata)", safe)):
            if not pool:
                continue
            best = min(pool, key=lambda r: r["us"])
            speed = old["us"] / best["us"] if "us" in old else None
            print(f"| {case}{label} | {best['impl']} | {fmt(best['us'])} | {fmt(best.get('frac_4.24'))} | "
                  f"{fmt(best.get('frac_measured_copy'))} | {fmt(old.get('us'))} | {fmt(speed)} |")
    unavailable = sorted({r["impl"] for r in rows if "unavailable" in r})
    if unavailable:
        print(f"\nunavailable here: {', '.join(unavailable)} ({next(r['unavailable'] for r in rows if 'unavailable' in r)})")


def status(r):
    if "unavailable" in r:
        return "unavailable"
    return "ok" if r.get("ok") else str(r.get("error", "FAILED"))[:60]


def main():
    t0 = time.time()
    result = {"device": torch.cuda.get_device_name() if GPU else "cpu (interpreter)",
              "torch": torch.__version__, "triton": __import__("triton").__version__,
              "new_config": dataclasses.asdict(NEW), "old_config": dataclasses.asdict(OLD), "rows": [], "checks": []}
    result["copy_tbps"] = measured_copy_tbps()
    flush = None
    if GPU:
        from fk_pytest.timing import L2Flusher
        flush = L2Flusher(DEVICE)
    replay_checks = {"one-pass": NEW}
    if not ARGS.no_sweep:  # the PDL variants: a graph replayed after its metadata changed in place
        replay_checks.update({label: dataclasses.replace(OLD, **VARIANTS[label])
                              for label in ("2p pdl merge", "2p il pdl-all", "2p il early-md",
                                            "2p fused merge early-md")})
    for label, config in replay_checks.items():
        try:
            result["checks"].append(check_graph_replay_new_metadata(config, label))
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc()
            result["checks"].append({"check": f"graph-replay-new-metadata {label}", "ok": False, "error": repr(exc)})
    if ARGS.tiny_cpu:
        try:
            result["checks"].append(check_sm90_compile())
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc()
            result["checks"].append({"check": "sm90-compile + PDL order in PTX", "ok": False, "error": repr(exc)})
    for batch, context in ([] if ARGS.only_ceilings else CASES):
        try:
            run_case(batch, context, flush, result)
        except Exception as exc:  # noqa: BLE001 - the other cases still run
            traceback.print_exc()
            result["rows"].append({"case": f"B{batch} C{context}", "impl": "old", "error": repr(exc)})
    if ARGS.ceilings or ARGS.only_ceilings:
        for context in ((8192, 2048) if GPU else (200,)):
            try:
                time_ceilings(context, flush, result)
            except Exception as exc:  # noqa: BLE001 - a measurement aid, not a check
                traceback.print_exc()
                result.setdefault("ceilings", []).append({"case": f"B1 C{context}", "error": repr(exc)})
                result["checks"].append({"check": f"ceilings B1 C{context} measured", "ok": False, "error": repr(exc)})
    result["wall_s"] = time.time() - t0
    if os.environ.get("OUT"):
        os.makedirs(os.environ["OUT"], exist_ok=True)
        with open(os.path.join(os.environ["OUT"], "h200_decode_b1.json"), "w") as f:
            json.dump(result, f, indent=1, default=str)
    print_tables(result)
    if result.get("ceilings"):
        print("\n| case | what | us | bytes / time, of 4.24 TB/s |\n|---|---|---|---|")
        for r in result["ceilings"]:
            print(f"| {r['case']} | {r.get('impl', '')}{' ERROR ' + r['error'][:120] if 'error' in r else ''} | {fmt(r.get('us'))} | {fmt(r.get('frac_4.24'))} |")
    print(f"\nwall {result['wall_s']:.0f} s")
    failed = [r for r in result["rows"] + result["checks"] if r.get("ok") is False]
    if failed:
        print(f"FAILED: {len(failed)} rows/checks")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
