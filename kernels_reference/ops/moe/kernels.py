"""The fast path of ``FusedMoE``: align the routed (token, expert) pairs to blocks, then grouped GEMMs.

The algorithm is the one vLLM's fused_moe popularised (written here from its description):

1. ``align_to_blocks``: the T*k (token, slot) pairs are sorted by expert (stable: pair order within an
   expert) and every expert's group is padded to a multiple of BLOCK_M, so each BLOCK_M-row tile of
   the GEMM belongs to one expert. Two small Triton kernels (one when the pairs fit one chunk, as at
   every decode step): per-chunk expert counts, then each chunk places its pairs after the earlier
   chunks' pairs of the same expert and writes its share of the padding and of the tile -> expert
   table. A chain of ~20 small torch ops did this before; inside a decode graph each costs a launch
   gap, more than the work. Sizes never depend on the routing, nothing is read back to the host, so
   a decode step is CUDA-graph capturable. The buffers are sized for the worst case (every used
   expert wasting BLOCK_M - 1 rows); tiles past the real end read the padded length on the device
   and exit at once. ``align_to_blocks_torch`` keeps the torch-op version as the readable definition.
2. ``grouped_gemm``: one Triton kernel; a program owns a BLOCK_M x BLOCK_N tile of one expert (and,
   with split-K, one slice of K), gathers its A rows through the sorted pair ids (token = pair // k
   for the first GEMM, pair itself for the second), multiplies by that expert's weight and scatters
   rows back to pair order, optionally scaled by the pair's routing weight (the down GEMM).
3. ``sum_slots``: one Triton kernel sums a token's k weighted expert outputs (and the split-K
   partials) in float32 in a fixed order and rounds once.

Launch configs: BLOCK_M follows the mean rows per expert (the sort is padded to it, so it is chosen
before the sort, not tuned). Decode sizes (a few rows per expert) are a weight stream, GEMV-like:
16-row tiles, and enough programs that every SM keeps loads in flight; the down GEMM splits K when
the tiles alone leave SMs idle (Mixtral T1: 2 experts x 64 N tiles = 128 programs for 132 SMs, each
streaming 1.8 MB). Timing equals against each other would pick one at random (see ``triton_rows``),
so decode configs are fixed (``benchmarks/moe.py --sweep`` compares candidates); prefill sizes
autotune the N/K tiles, GROUP_M swizzle, warps and stages.

The small-batch path (up to ``GEMV_MAX_TOKENS`` tokens; ``FusedMoE.forward_triton``): with one row
per expert, a 16-row tl.dot tile is 15/16 padding and the align step is a launch with nothing to
sort (a token's k experts are distinct, a few tokens rarely share one). Two GEMV kernels replace
steps 1-3: ``gemv_gate_up`` runs one program per (pair, column block), expert = topk_ids[pair],
multiply + row sum over K in float32, gate_up stored in x's dtype as before; after the ``act_fn``
child, ``gemv_down_sum`` runs one program per (token, column block) over the token's k experts,
weights each expert's float32 sum by its routing weight and adds them in float32, rounding once (the
numerics of the split-K decode path, float64 throughout for float64). Four launches instead of six,
and every weight byte read is a useful one. Their launch configs are fixed too (see GEMV_GATE_UP);
``override_configs(path=...)`` forces either path for the sweep and the tests.

This file is long because its kernels are one unit of launch plumbing: every launch goes through the
one ``_launch`` hook (the tests and the recording of which path ran replace that one name), reads
the one config table that ``override_configs`` swaps, and the align / GEMM / sum / GEMV steps are
chosen together by ``use_gemv``. Split into files, each would hold its own copy of those names and a
patch of one would miss the others.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import NamedTuple, Optional

import torch

from ...triton_rows import autotune, autotune_here, size_class

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None


class Alignment(NamedTuple):
    sorted_pairs: torch.Tensor  # int32 [max_rows]: pair ids grouped by expert; padding = n_pairs
    block_expert: torch.Tensor  # int32 [max_rows // block_m]: the expert of each row tile
    padded_rows: torch.Tensor  # int32 [1]: rows in use (the tiles past it exit at once)
    block_m: int


def max_padded_rows(n_pairs: int, num_experts: int, block_m: int) -> int:
    """Rows of the worst case: every expert that can be used wastes up to block_m - 1 rows."""
    used = min(num_experts, n_pairs)
    return triton_cdiv(n_pairs + used * (block_m - 1), block_m) * block_m if n_pairs else 0


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


ALIGN_TILE_ELEMENTS = 8192  # one program's [pairs x experts] one-hot tile: fits the registers of 4 warps


def align_chunk(num_experts: int) -> int:
    """Pairs per align program: the one-hot [chunk, experts] tile stays ALIGN_TILE_ELEMENTS."""
    return max(16, min(1024, ALIGN_TILE_ELEMENTS // triton.next_power_of_2(num_experts)))


def _launch(kernel, grid, *args, **kwargs):
    """Every Triton launch of this module goes through here (tests run the launches outside a torch
    dispatch mode: the interpreter copies tensors to numpy, a CPU-only artefact)."""
    kernel[grid](*args, **kwargs)


def align_to_blocks(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> Alignment:
    """Sort the (token, slot) pairs by expert, each expert's group padded to a multiple of block_m.

    One Triton launch when all pairs fit one chunk (decode), two otherwise; the result equals
    :func:`align_to_blocks_torch` exactly. Every output element is written by a kernel, so the
    buffers are torch.empty and nothing waits for the device.
    """
    if _OVERRIDES.get("align") == "torch":
        return align_to_blocks_torch(topk_ids, num_experts, block_m)
    device = topk_ids.device
    flat = topk_ids.reshape(-1)
    if flat.dtype != torch.int32:
        flat = flat.to(torch.int32)
    flat = flat.contiguous()
    n_pairs = flat.numel()
    max_rows = max_padded_rows(n_pairs, num_experts, block_m)
    sorted_pairs = torch.empty(max_rows, dtype=torch.int32, device=device)
    block_expert = torch.empty(max_rows // block_m, dtype=torch.int32, device=device)
    if n_pairs == 0:
        return Alignment(sorted_pairs, block_expert, torch.zeros(1, dtype=torch.int32, device=device), block_m)
    padded_rows = torch.empty(1, dtype=torch.int32, device=device)
    e_pad = triton.next_power_of_2(num_experts)
    chunk = align_chunk(num_experts)
    n_chunks = triton_cdiv(n_pairs, chunk)
    counts = flat  # not read when one program sees every pair
    if n_chunks > 1:
        counts = torch.empty((n_chunks, num_experts), dtype=torch.int32, device=device)
        _launch(_count_chunk_kernel, (n_chunks,), flat, counts, n_pairs, num_experts, CHUNK=chunk, E_PAD=e_pad)
    share = triton_cdiv(triton_cdiv(max_rows, n_chunks), block_m) * block_m  # rows each program pads
    _launch(_place_pairs_kernel, (n_chunks,), flat, counts, sorted_pairs, block_expert, padded_rows,
            n_pairs, num_experts, n_chunks, max_rows, share, CHUNK=chunk, E_PAD=e_pad, BLOCK_M=block_m,
            COUNT_ROWS=max(1, min(64, triton.next_power_of_2(n_chunks))), SINGLE=n_chunks == 1)
    return Alignment(sorted_pairs, block_expert, padded_rows, block_m)


def align_to_blocks_torch(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> Alignment:
    """The same alignment from fixed-size torch ops (scatter_add, cumsum, stable sort, searchsorted):
    the readable definition the Triton version is tested against. Output sizes follow from the input
    *shapes* only (no nonzero/unique/bincount, no .item()), so it is capturable too, at ~20 launches."""
    device = topk_ids.device
    flat = topk_ids.reshape(-1).to(torch.int64)
    n_pairs = flat.numel()
    max_rows = max_padded_rows(n_pairs, num_experts, block_m)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    padded_start = padded_end - padded
    group_start = torch.cumsum(counts, 0) - counts  # where each expert's pairs begin in sorted order
    experts_sorted, pair_order = torch.sort(flat, stable=True)
    rank = torch.arange(n_pairs, device=device) - group_start[experts_sorted]
    sorted_pairs = torch.full((max_rows,), n_pairs, dtype=torch.int32, device=device)
    sorted_pairs.scatter_(0, padded_start[experts_sorted] + rank, pair_order.to(torch.int32))
    tile_start = torch.arange(0, max_rows, block_m, device=device)
    block_expert = torch.searchsorted(padded_end, tile_start, right=True)
    # tiles past the last expert's padded end: point at expert 0 (never read, the kernel exits)
    block_expert = torch.where(block_expert < num_experts, block_expert, 0).to(torch.int32)
    return Alignment(sorted_pairs, block_expert, padded_end[-1:].to(torch.int32), block_m)


if triton is not None:

    @triton.jit
    def _one_hot(ids_ptr, chunk_id, n_pairs, n_experts, CHUNK: tl.constexpr, E_PAD: tl.constexpr):
        pair = chunk_id * CHUNK + tl.arange(0, CHUNK)
        valid = pair < n_pairs
        ids = tl.load(ids_ptr + pair, mask=valid, other=-1)
        experts = tl.arange(0, E_PAD)
        hot = (ids[:, None] == experts[None, :]) & valid[:, None] & (experts < n_experts)[None, :]
        return pair, valid, hot.to(tl.int32)

    @triton.jit
    def _count_chunk_kernel(ids_ptr, counts_ptr, n_pairs, n_experts, CHUNK: tl.constexpr, E_PAD: tl.constexpr):
        c = tl.program_id(0)
        _, _, hot = _one_hot(ids_ptr, c, n_pairs, n_experts, CHUNK, E_PAD)
        experts = tl.arange(0, E_PAD)
        tl.store(counts_ptr + c * n_experts + experts, tl.sum(hot, axis=0), mask=experts < n_experts)

    @triton.jit
    def _place_pairs_kernel(ids_ptr, counts_ptr, sorted_ptr, block_expert_ptr, padded_rows_ptr,
                            n_pairs, n_experts, n_chunks, max_rows, share,
                            CHUNK: tl.constexpr, E_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                            COUNT_ROWS: tl.constexpr, SINGLE: tl.constexpr):
        c = tl.program_id(0)
        experts = tl.arange(0, E_PAD)
        pair, valid, hot = _one_hot(ids_ptr, c, n_pairs, n_experts, CHUNK, E_PAD)
        # every expert's pair count, and how many of its pairs the earlier chunks hold
        if SINGLE:
            total = tl.sum(hot, axis=0)
            before = tl.zeros([E_PAD], dtype=tl.int32)
        else:
            total = tl.zeros([E_PAD], dtype=tl.int32)
            before = tl.zeros([E_PAD], dtype=tl.int32)
            for r0 in range(0, n_chunks, COUNT_ROWS):
                r = r0 + tl.arange(0, COUNT_ROWS)
                cc = tl.load(counts_ptr + r[:, None] * n_experts + experts[None, :],
                             mask=(r < n_chunks)[:, None] & (experts < n_experts)[None, :], other=0)
                total += tl.sum(cc, axis=0)
                before += tl.sum(tl.where(r[:, None] < c, cc, 0), axis=0)
        padded = (total + BLOCK_M - 1) // BLOCK_M * BLOCK_M  # 0 for idle experts and padding columns
        padded_end = tl.cumsum(padded, axis=0)
        padded_start = padded_end - padded
        # a pair's rank among its expert's pairs of this chunk: the same expert's pairs before it
        rank = tl.sum((tl.cumsum(hot, axis=0) - hot) * hot, axis=1)
        base = tl.sum(hot * (padded_start + before)[None, :], axis=1)
        tl.store(sorted_ptr + base + rank, pair, mask=valid)
        # this program's share of the rows: the padding (rows no pair lands on) and each tile's expert.
        # The pairs' rows and the padding rows are disjoint, so no program waits for another.
        real_end = padded_start + total
        lo = c * share
        hi = tl.minimum(lo + share, max_rows)
        for p0 in range(lo, hi, CHUNK):
            p = p0 + tl.arange(0, CHUNK)
            in_range = p < hi
            holds_pair = tl.max(((p[:, None] >= padded_start[None, :]) & (p[:, None] < real_end[None, :]))
                                .to(tl.int32), axis=1)
            tl.store(sorted_ptr + p, tl.zeros([CHUNK], dtype=tl.int32) + n_pairs, mask=in_range & (holds_pair == 0))
            # the tile's expert: how many experts end at or before it (as searchsorted(right=True));
            # tiles past the last expert point at expert 0 (never read: the GEMM exits there)
            expert = tl.sum(((padded_end[None, :] <= p[:, None]) & (experts < n_experts)[None, :]).to(tl.int32),
                            axis=1)
            expert = tl.where(expert < n_experts, expert, 0)
            tl.store(block_expert_ptr + p // BLOCK_M, expert, mask=in_range & (p % BLOCK_M == 0))
        if c == 0:
            tl.store(padded_rows_ptr, tl.sum(padded, axis=0))


# ---- configs -------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class GemmConfig:
    """One fixed launch of the grouped GEMM. ``split_k`` > 1 (down GEMM only) writes float32 partials
    that :func:`sum_slots` adds up with the k slots."""
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    split_k: int = 1
    group_m: int = 1


_OVERRIDES: dict = {}


@contextlib.contextmanager
def override_configs(block_m: int = None, gate_up: GemmConfig = None, down: GemmConfig = None,
                     align: str = None, path: str = None, gemv_gate_up: "GemvConfig" = None,
                     gemv_down: "GemvConfig" = None):
    """Force the launch configs of every FusedMoE fast-path call inside the block (the config sweep
    of ``benchmarks/moe.py``; tests of split-K on the CPU). Launch parameters are baked into a CUDA
    graph at capture, so capturing inside the block is what fixes a graph's config. ``align="torch"``
    aligns with the torch-op chain (the previous fast path) to measure what the kernels save.
    ``path="gemv"`` / ``"grouped"`` forces the small-batch GEMV path / the grouped GEMMs at any token
    count (default: GEMV up to GEMV_MAX_TOKENS); ``gemv_gate_up`` / ``gemv_down`` fix its launches."""
    if align not in (None, "torch", "triton"):
        raise ValueError(f"align={align!r}: 'torch' or 'triton'")
    if path not in (None, "gemv", "grouped"):
        raise ValueError(f"path={path!r}: 'gemv' or 'grouped'")
    saved = dict(_OVERRIDES)
    _OVERRIDES.update({k: v for k, v in (("block_m", block_m), ("gate_up", gate_up), ("down", down),
                                         ("align", align), ("path", path), ("gemv_gate_up", gemv_gate_up),
                                         ("gemv_down", gemv_down)) if v is not None})
    try:
        yield
    finally:
        _OVERRIDES.clear()
        _OVERRIDES.update(saved)


def choose_block_m(n_pairs: int, num_experts: int) -> int:
    """Rows per tile from the mean rows per expert: decode steps give each expert a few rows (a 16-row
    tile wastes least padding, the minimum tl.dot takes), prefill hundreds (128-row tiles reuse each
    weight tile the most)."""
    if "block_m" in _OVERRIDES:
        return _OVERRIDES["block_m"]
    mean = n_pairs / num_experts
    return 16 if mean <= 16 else 32 if mean <= 48 else 64 if mean <= 160 else 128


@functools.lru_cache(maxsize=None)
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


DECODE_MEAN_ROWS = 16  # mean rows per expert up to which a launch takes a fixed config
DECODE_BLOCK_N, DECODE_BLOCK_K = 64, 128
MAX_SPLIT_K = 8


def gemm_config(role: str, n_pairs: int, num_experts: int, n: int, k: int, a: torch.Tensor) -> Optional[GemmConfig]:
    """The launch of one grouped GEMM (``role``: "gate_up" or "down"); None = autotune (prefill).

    Decode (mean rows per expert <= DECODE_MEAN_ROWS): the used experts' weights stream once, so the
    GEMM is a GEMV in disguise and bandwidth comes from many programs each keeping deep loads in
    flight: 64 x 128 bf16 weight tiles (16 KB, 256 B per row: wide loads) with 4 stages. The tiles in
    use are about min(n_pairs, experts) x N / 64; when that leaves fewer than two programs per SM
    the down GEMM splits K (its float32 partials are summed with the k slots at no extra launch);
    gate_up does not (its output feeds the activation child, which needs it whole).
    """
    if role in _OVERRIDES:
        cfg = _OVERRIDES[role]
        return dataclasses.replace(cfg, split_k=1) if role == "gate_up" else cfg
    on_gpu = autotune_here(a)
    if on_gpu and n_pairs / num_experts > DECODE_MEAN_ROWS:
        return None
    if not on_gpu:  # the interpreter pays per program: big tiles, no pipelining
        return GemmConfig(block_n=max(16, min(128, triton.next_power_of_2(n))),
                          block_k=max(16, min(128, triton.next_power_of_2(k))), num_warps=4, num_stages=1)
    split = 1
    if role == "down":
        programs = min(n_pairs, num_experts) * triton_cdiv(n, DECODE_BLOCK_N)
        k_steps = triton_cdiv(k, DECODE_BLOCK_K)
        while (programs * split < 2 * sm_count(a.device.index or 0) and split < MAX_SPLIT_K
               and k_steps // (2 * split) >= 2):  # each slice keeps >= 2 K steps to pipeline
            split *= 2
    return GemmConfig(block_n=DECODE_BLOCK_N, block_k=DECODE_BLOCK_K, num_warps=4, num_stages=4, split_k=split)


def _prefill_configs():
    out = []
    for bn, bk, warps, stages in ((128, 64, 4, 4), (128, 64, 8, 3), (256, 64, 8, 3), (128, 128, 8, 3),
                                  (64, 64, 4, 4), (256, 64, 8, 4)):
        out.append(triton.Config({"BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}, num_warps=warps, num_stages=stages))
    return out


def _prune(configs, named_args, **kwargs):
    # 128 x 256 tiles with 4 stages of 64-deep K exceed shared memory with 128-row tiles; keep the rest
    bm = kwargs.get("BLOCK_M", named_args.get("BLOCK_M", 64))
    kept = [c for c in configs if (bm + c.kwargs["BLOCK_N"]) * c.kwargs["BLOCK_K"] * 2 * c.num_stages <= 200 * 1024]
    return kept or configs[:1]


def grouped_gemm(a: torch.Tensor, w: torch.Tensor, out: torch.Tensor, align: Alignment, rows_per_a: int,
                 routing_weights: torch.Tensor = None, config: Optional[GemmConfig] = None) -> torch.Tensor:
    """out[pair] = a[pair // rows_per_a] @ w[expert(pair)].T (times routing_weights[pair] if given).

    a: [M_a, K]; w: [E, N, K] (rows are output features, as nn.Linear stores them); out: [n_pairs, N],
    or [split_k, n_pairs, N] (float32 partial sums over K slices) with a split-K ``config``.
    ``config`` None autotunes (CUDA only).
    """
    split = config.split_k if config is not None else 1
    if (out.dim() == 3) != (split > 1) or (out.dim() == 3 and out.shape[0] != split):
        raise ValueError(f"out {tuple(out.shape)} does not match split_k={split}")
    n_pairs = out.shape[-2]
    num_experts, n, k = w.shape
    if n_pairs == 0:
        return out
    max_rows = align.sorted_pairs.numel()
    # float32 must not silently drop to TF32 on the GPU; Triton's interpreter multiplies bfloat16
    # tiles wrongly (it reads their raw bits), so off the GPU the tiles are upcast first (exact).
    f32_dot = a.dtype == torch.float32 or not a.is_cuda
    args = (a, w, out, routing_weights if routing_weights is not None else out, align.sorted_pairs,
            align.block_expert, align.padded_rows, n, k, n_pairs, max_rows,
            a.stride(0), a.stride(1), w.stride(0), w.stride(1), w.stride(2), out.stride(-2),
            out.stride(0) if split > 1 else 0, size_class(n_pairs))
    consts = dict(ROWS_PER_A=rows_per_a, MUL_WEIGHT=routing_weights is not None, BLOCK_M=align.block_m,
                  F32_DOT=f32_dot, SPLIT_K=split)
    if config is None:
        grid = lambda meta: (triton.cdiv(max_rows, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)  # noqa: E731
        _launch(_tuned_gemm(), grid, *args, **consts)
    else:
        grid = (triton.cdiv(max_rows, align.block_m) * triton.cdiv(n, config.block_n) * split,)
        _launch(_moe_gemm_kernel, grid, *args, **consts, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                GROUP_M=config.group_m, num_warps=config.num_warps, num_stages=config.num_stages)
    return out


def sum_slots(partials: torch.Tensor, tokens: int, top_k: int, dtype: torch.dtype) -> torch.Tensor:
    """out[t] = sum over split s and slot j of partials[s, t*k + j], in float32 (float64 for float64)
    in a fixed order, rounded once to ``dtype``. ``partials``: [n_pairs, H] or [splits, n_pairs, H]."""
    parts = partials if partials.dim() == 3 else partials.unsqueeze(0)
    splits, n_pairs, h = parts.shape
    out = torch.empty(tokens, h, dtype=dtype, device=partials.device)
    if tokens == 0:
        return out
    block_h = min(1024, triton.next_power_of_2(h)) if autotune_here(partials) else triton.next_power_of_2(h)
    _launch(_sum_slots_kernel, (tokens, triton.cdiv(h, block_h)), parts, out, h, parts.stride(0), parts.stride(1),
            SPLITS=splits, TOP_K=top_k, BLOCK_H=block_h, ACC_F64=dtype == torch.float64,
            num_warps=4 if block_h >= 512 else 1)
    return out


# ---- the small-batch path: two GEMV kernels, no align step ---------------------------------------
GEMV_MAX_TOKENS = 4  # up to this many tokens forward_triton takes the GEMV path (see use_gemv)


@dataclasses.dataclass(frozen=True)
class GemvConfig:
    """One fixed launch of a GEMV kernel: BLOCK_N output columns per program, BLOCK_K-wide steps of
    the reduction, ``num_stages`` of them in flight (the loads are pipelined even without tl.dot
    because the K loop is a ``tl.range`` with explicit stages)."""
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 4


# H200 defaults (132 SMs). A decode step is a weight stream: the used experts' rows are read once,
# so the grid has to keep every SM busy and the loads deep enough to cover DRAM latency.
# * BLOCK_K 256: one warp's 32 lanes x 8 bf16 (16-byte vectors) span a step's K, so the per-step
#   row sums are register adds + warp shuffles, never a cross-warp (shared memory) reduction; the
#   models' K (H 2048/4096, I 768/14336) are multiples of it, DeepSeek's I=1408 leaves a half step.
# * gate_up, BLOCK_N 16: a [16, 256] bf16 tile is 8 KB, 4 x 16-byte loads per thread. Programs at
#   T=1 = k x 2I/16: Qwen3 8 x 96 = 768, DeepSeek 6 x 176 = 1056, Mixtral 2 x 1792 = 3584, i.e.
#   >= 5 per SM, each with 3 steps (24 KB) in flight.
# * down (+ the k-sum), BLOCK_N 4: each program owns a token's columns for all k experts (the sum
#   stays in registers), so the grid is only T x H/BLOCK_N: H=2048 (Qwen3, DeepSeek) gives 512
#   programs at T=1 (~4 per SM; BLOCK_N 8 would give 256, fewer than 2 per SM, BLOCK_N 16 128,
#   leaving SMs idle) and Mixtral H=4096 1024. A [4, 256] bf16 tile is 2 KB, one 16-byte load per
#   thread (a warp per row); depth comes from the stages: 6 keep 10 KB per program (~40 KB per SM,
#   ~5 MB over the GPU, about bandwidth x DRAM latency) in flight, 15 KB of shared memory.
# The K loop of the down kernel runs over (expert slot, K step) flattened, so the pipeline never
# drains between a token's k experts (Qwen3: 8 experts x 3 steps would otherwise refill 8 times).
# Compiled ahead of time for sm_90 (Triton 3.9, the runtime's divisibility-16 specialisation of the
# three models' shapes): both kernels' bf16 tiles are cp.async-pipelined (3 / 5 tiles in flight),
# 16-byte vectors, 46 / 30 registers, no spills, the K sums within a warp. A K that is not a
# multiple of 16 (not one of the models) loses the vector loads and the pipelining, not correctness.
# ``benchmarks/moe.py --sweep`` times these against neighbours; no autotune (capture, stability).
GEMV_GATE_UP = GemvConfig(block_n=16, block_k=256, num_warps=4, num_stages=4)
# Measured on the H200 (docs/perf/h200-moe.md, sweep): 2 warps for the down kernel's [4, 256] tiles
# beat 4 at every decode case (Qwen3 T1 28.6 vs 30.8 us, DeepSeek T1 35.7 vs 38.5, Mixtral T1 166 vs
# 189, Qwen3 T4 67.6 vs 80.1). Why was not profiled; a likely reason is that at 4 warps each warp
# owns one 512-byte row of the tile, at 2 warps two, so each warp has more loads in flight.
GEMV_DOWN = GemvConfig(block_n=4, block_k=256, num_warps=2, num_stages=6)


def use_gemv(tokens: int) -> bool:
    """The GEMV path at a few tokens: k pairs per token are k different experts, and at <= 4 tokens
    an expert rarely serves two pairs, so per-pair GEMVs read each weight row about once, with no
    sort and no 16-row tiles of which one row is real."""
    path = _OVERRIDES.get("path")
    return path == "gemv" if path is not None else tokens <= GEMV_MAX_TOKENS


def gemv_config(role: str, n: int, k: int, a: torch.Tensor) -> GemvConfig:
    """The launch of one GEMV kernel (``role``: "gate_up" or "down") for [*, K] @ [N, K].T."""
    if "gemv_" + role in _OVERRIDES:
        return _OVERRIDES["gemv_" + role]
    if autotune_here(a):
        return GEMV_GATE_UP if role == "gate_up" else GEMV_DOWN
    # the interpreter pays per program: big tiles, no pipelining
    return GemvConfig(block_n=max(16, min(64, triton.next_power_of_2(n))),
                      block_k=max(16, min(128, triton.next_power_of_2(k))), num_warps=4, num_stages=1)


def gemv_gate_up(x: torch.Tensor, topk_ids: torch.Tensor, w13: torch.Tensor,
                 config: Optional[GemvConfig] = None) -> torch.Tensor:
    """gate_up[t*k + j] = x[t] @ w13[topk_ids[t, j]].T: [T*k, 2I] in x's dtype (rounded once from a
    float32 sum, float64 for float64 x), pair order, as the grouped GEMM writes it. One launch."""
    tokens, hidden = x.shape
    top_k = topk_ids.shape[1]
    num_experts, n, k = w13.shape
    if k != hidden:
        raise ValueError(f"w13 {tuple(w13.shape)} does not match hidden states of width {hidden}")
    out = torch.empty(tokens * top_k, n, dtype=x.dtype, device=x.device)
    if tokens == 0:
        return out
    cfg = config or gemv_config("gate_up", n, k, x)
    # pairs vary fastest: programs running together read the same columns, so two pairs of one
    # expert (rare at these sizes) share the weight tile through L2
    _launch(_gemv_gate_up_kernel, (tokens * top_k, triton.cdiv(n, cfg.block_n)), x, topk_ids, w13, out, n, k,
            x.stride(0), x.stride(1), topk_ids.stride(0), topk_ids.stride(1),
            w13.stride(0), w13.stride(1), w13.stride(2), out.stride(0),
            TOP_K=top_k, ACC_F64=x.dtype == torch.float64, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
            NUM_STAGES=cfg.num_stages, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out


def gemv_down_sum(act: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w2: torch.Tensor,
                  dtype: torch.dtype, config: Optional[GemvConfig] = None) -> torch.Tensor:
    """out[t] = sum_j topk_weights[t, j] * (act[t*k + j] @ w2[topk_ids[t, j]].T), the products, the
    weighting and the k-sum in float32 (float64 for float64), rounded once to ``dtype``: the down
    GEMM and sum_slots of the grouped path in one launch. act: [T*k, I]; w2: [E, H, I]."""
    tokens, top_k = topk_ids.shape
    num_experts, n, k = w2.shape
    if act.shape != (tokens * top_k, k):
        raise ValueError(f"act {tuple(act.shape)} is not [{tokens} * {top_k}, {k}]")
    out = torch.empty(tokens, n, dtype=dtype, device=act.device)
    if tokens == 0:
        return out
    cfg = config or gemv_config("down", n, k, act)
    _launch(_gemv_down_sum_kernel, (tokens, triton.cdiv(n, cfg.block_n)), act, topk_ids, topk_weights, w2, out,
            n, k, act.stride(0), act.stride(1), topk_ids.stride(0), topk_ids.stride(1),
            topk_weights.stride(0), topk_weights.stride(1), w2.stride(0), w2.stride(1), w2.stride(2),
            out.stride(0), TOP_K=top_k, TOP_K_PAD=triton.next_power_of_2(top_k),
            ACC_F64=dtype == torch.float64, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
            NUM_STAGES=cfg.num_stages, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out


@functools.lru_cache(maxsize=None)
def _tuned_gemm():
    # Keyed on the GEMM shape, the expert count (via the tile count bucket) and the pair-count bucket.
    return autotune(configs=_prefill_configs(), key=["N", "K", "size_cls", "BLOCK_M", "ROWS_PER_A"],
                    prune_configs_by={"early_config_prune": _prune})(_moe_gemm_kernel)


if triton is not None:

    @triton.jit(do_not_specialize=["size_cls"])
    def _moe_gemm_kernel(a_ptr, w_ptr, out_ptr, rw_ptr, sorted_pairs_ptr, block_expert_ptr, padded_rows_ptr,
                         N, K, n_pairs, max_rows,
                         stride_am, stride_ak, stride_we, stride_wn, stride_wk, stride_om, stride_os, size_cls,
                         ROWS_PER_A: tl.constexpr, MUL_WEIGHT: tl.constexpr, F32_DOT: tl.constexpr,
                         SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
        # Neighbouring programs take the K slices of one tile; then GROUP_M row tiles share each
        # column sweep, so a weight tile is reused from L2 by the tiles of the same expert that run
        # at the same time.
        pid = tl.program_id(0)
        pid_k = pid % SPLIT_K
        pid = pid // SPLIT_K
        tiles_m = tl.cdiv(max_rows, BLOCK_M)
        tiles_n = tl.cdiv(N, BLOCK_N)
        per_group = GROUP_M * tiles_n
        first_m = (pid // per_group) * GROUP_M
        group_size = tl.minimum(tiles_m - first_m, GROUP_M)
        pid_m = first_m + (pid % per_group) % group_size
        pid_n = (pid % per_group) // group_size
        if pid_m * BLOCK_M >= tl.load(padded_rows_ptr):
            return  # a tile of the worst-case padding this routing did not need
        expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        pair = tl.load(sorted_pairs_ptr + rows)
        valid = pair < n_pairs
        a_row = (pair // ROWS_PER_A).to(tl.int64)
        # Columns past N wrap around (modulo) instead of being masked: the loads stay unmasked in
        # N and the wrapped columns are dropped at the store.
        cols = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
        # this program's slice of K: whole BLOCK_K steps (the last slice may hold fewer, or none)
        steps = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K)
        k_lo = pid_k * steps * BLOCK_K
        ks = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + a_row[:, None] * stride_am + (k_lo + ks)[None, :] * stride_ak
        w_ptrs = w_ptr + expert * stride_we + cols[None, :].to(tl.int64) * stride_wn + (k_lo + ks)[:, None] * stride_wk
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for step in range(0, steps):
            k_left = K - k_lo - step * BLOCK_K
            a = tl.load(a_ptrs, mask=valid[:, None] & (ks[None, :] < k_left), other=0.0)
            b = tl.load(w_ptrs, mask=ks[:, None] < k_left, other=0.0)
            if F32_DOT:
                acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(a, b, acc)
            a_ptrs += BLOCK_K * stride_ak
            w_ptrs += BLOCK_K * stride_wk
        if MUL_WEIGHT:  # the routing weight scales the float32 accumulator, before the one rounding
            acc = acc * tl.load(rw_ptr + pair, mask=valid, other=0.0).to(tl.float32)[:, None]
        out_cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        out_ptrs = out_ptr + pid_k * stride_os + pair.to(tl.int64)[:, None] * stride_om + out_cols[None, :]
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=valid[:, None] & (out_cols < N)[None, :])

    @triton.jit
    def _sum_slots_kernel(p_ptr, out_ptr, H, stride_split, stride_pair, SPLITS: tl.constexpr,
                          TOP_K: tl.constexpr, BLOCK_H: tl.constexpr, ACC_F64: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        mask = cols < H
        if ACC_F64:
            acc = tl.zeros([BLOCK_H], dtype=tl.float64)
        else:
            acc = tl.zeros([BLOCK_H], dtype=tl.float32)
        for s in tl.static_range(SPLITS):
            for j in tl.static_range(TOP_K):
                row = p_ptr + s * stride_split + (t * TOP_K + j) * stride_pair
                acc += tl.load(row + cols, mask=mask, other=0.0).to(acc.dtype)
        tl.store(out_ptr + t * H + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _gemv_gate_up_kernel(x_ptr, ids_ptr, w_ptr, out_ptr, N, K,
                             stride_xt, stride_xk, stride_it, stride_ij, stride_we, stride_wn, stride_wk,
                             stride_op, TOP_K: tl.constexpr, ACC_F64: tl.constexpr, BLOCK_N: tl.constexpr,
                             BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr):
        # One (token, slot) pair's BLOCK_N output columns: a [BLOCK_N, BLOCK_K] weight tile times the
        # token's K slice, summed along K per step (multiply + reduce, no tl.dot: one real row).
        pair = tl.program_id(0).to(tl.int64)
        t = pair // TOP_K
        expert = tl.load(ids_ptr + t * stride_it + (pair % TOP_K) * stride_ij).to(tl.int64)
        out_cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        # columns past N wrap around instead of being masked (the loads stay unmasked in N); the
        # wrapped columns are dropped at the store
        cols = out_cols % N
        ks = tl.arange(0, BLOCK_K)
        x_row = x_ptr + t * stride_xt
        w_rows = w_ptr + expert * stride_we + cols[:, None] * stride_wn
        acc = tl.zeros([BLOCK_N], dtype=tl.float64 if ACC_F64 else tl.float32)
        for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
            in_k = ks < K - k0
            xv = tl.load(x_row + (k0 + ks) * stride_xk, mask=in_k, other=0.0)
            wv = tl.load(w_rows + (k0 + ks)[None, :] * stride_wk, mask=in_k[None, :], other=0.0)
            acc += tl.sum(wv.to(acc.dtype) * xv.to(acc.dtype)[None, :], axis=1)
        tl.store(out_ptr + pair * stride_op + out_cols, acc.to(out_ptr.dtype.element_ty), mask=out_cols < N)

    @triton.jit
    def _gemv_down_sum_kernel(a_ptr, ids_ptr, rw_ptr, w_ptr, out_ptr, N, K,
                              stride_ap, stride_ak, stride_it, stride_ij, stride_rt, stride_rj,
                              stride_we, stride_wn, stride_wk, stride_ot, TOP_K: tl.constexpr,
                              TOP_K_PAD: tl.constexpr, ACC_F64: tl.constexpr, BLOCK_N: tl.constexpr,
                              BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr):
        # One token's BLOCK_N output columns over all k of its experts: acc_j = act[t*k+j] @ w2[e_j].T
        # in float32, out += weight_j * acc_j (float32), one rounding at the store.
        t = tl.program_id(0).to(tl.int64)
        out_cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        cols = out_cols % N  # wrapped, dropped at the store (as in the gate_up kernel)
        ks = tl.arange(0, BLOCK_K)
        # the token's k experts and routing weights, read once into registers: inside the loop an
        # expert is picked out of them by register ops, so the weight loads' addresses depend on no
        # load of the loop and the pipeliner can issue them stages ahead
        slots = tl.arange(0, TOP_K_PAD)
        ids = tl.load(ids_ptr + t * stride_it + slots * stride_ij, mask=slots < TOP_K, other=0).to(tl.int64)
        acc_dtype = tl.float64 if ACC_F64 else tl.float32
        rws = tl.load(rw_ptr + t * stride_rt + slots * stride_rj, mask=slots < TOP_K, other=0.0).to(acc_dtype)
        acc = tl.zeros([BLOCK_N], dtype=acc_dtype)
        out = tl.zeros([BLOCK_N], dtype=acc_dtype)
        k_steps = tl.cdiv(K, BLOCK_K)
        # (slot, K step) flattened into one loop: the pipeline streams a token's k experts back to back
        for s in tl.range(0, TOP_K * k_steps, num_stages=NUM_STAGES):
            j = s // k_steps
            k0 = (s - j * k_steps) * BLOCK_K
            expert = tl.sum(tl.where(slots == j, ids, 0), axis=0)
            in_k = ks < K - k0
            av = tl.load(a_ptr + (t * TOP_K + j) * stride_ap + (k0 + ks) * stride_ak, mask=in_k, other=0.0)
            wv = tl.load(w_ptr + expert * stride_we + cols[:, None] * stride_wn + (k0 + ks)[None, :] * stride_wk,
                         mask=in_k[None, :], other=0.0)
            acc += tl.sum(wv.to(acc_dtype) * av.to(acc_dtype)[None, :], axis=1)
            # the slot's last K step: weight its whole float32 sum, add it to the token's, restart
            last = k0 + BLOCK_K >= K
            rw = tl.sum(tl.where(slots == j, rws, 0.0), axis=0)
            out += tl.where(last, rw * acc, 0.0)
            acc = tl.where(last, 0.0, acc)
        tl.store(out_ptr + t * stride_ot + out_cols, out.to(out_ptr.dtype.element_ty), mask=out_cols < N)
