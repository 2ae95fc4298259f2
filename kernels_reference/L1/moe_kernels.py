"""The fast path of ``FusedMoE``: align the routed (token, expert) pairs to blocks, then grouped GEMMs.

The algorithm is the one vLLM's fused_moe popularised (written here from its description):

1. ``align_to_blocks``: the T*k (token, slot) pairs are sorted by expert and every expert's group is
   padded to a multiple of BLOCK_M, so each BLOCK_M-row tile of the GEMM belongs to one expert.
   Done with fixed-size torch ops only (scatter_add, cumsum, sort, searchsorted): sizes never depend
   on the routing, nothing is read back to the host, so a decode step is CUDA-graph capturable.
   The buffers are sized for the worst case (every used expert wasting BLOCK_M - 1 rows); tiles past
   the real end read the padded length on the device and exit at once.
2. ``grouped_gemm``: one Triton kernel; a program owns a BLOCK_M x BLOCK_N tile of one expert, gathers
   its A rows through the sorted pair ids (token = pair // k for the first GEMM, pair itself for the
   second), multiplies by that expert's weight and scatters rows back to pair order, optionally
   scaled by the pair's routing weight (the down GEMM).

Launch configs: BLOCK_M follows the mean rows per expert (the sort is padded to it, so it is chosen
before the sort, not tuned); decode sizes (a few rows per expert: the weights stream once and the
run is latency/bandwidth bound) take fixed configs, since timing equals against each other would pick
one at random (see ``triton_rows``); prefill sizes autotune the N/K tiles, GROUP_M swizzle, warps and
stages (3-4 stages: Hopper's shared memory holds them at these tiles).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from ..triton_rows import autotune_here, size_class

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


def align_to_blocks(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> Alignment:
    """Sort the (token, slot) pairs by expert, each expert's group padded to a multiple of block_m.

    Only torch ops whose output sizes follow from the input *shapes* (no nonzero/unique/bincount,
    no .item()), so nothing waits for the device: see ``tests/test_moe.py``.
    """
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


# ---- configs -------------------------------------------------------------------------------------
def choose_block_m(n_pairs: int, num_experts: int) -> int:
    """Rows per tile from the mean rows per expert: decode steps give each expert a few rows (a 16-row
    tile wastes least padding, the minimum tl.dot takes), prefill hundreds (128-row tiles reuse each
    weight tile the most)."""
    mean = n_pairs / num_experts
    return 16 if mean <= 16 else 32 if mean <= 48 else 64 if mean <= 160 else 128


def fixed_config(block_m: int, n: int, k: int, on_gpu: bool) -> dict:
    """Decode sizes (and the interpreter): the weights of the used experts stream once; many N tiles
    keep every SM loading. Deep K tiles with 4 stages keep enough bytes in flight per SM."""
    if not on_gpu:  # the interpreter pays per program: big tiles, no pipelining
        return dict(BLOCK_N=max(16, min(128, triton.next_power_of_2(n))),
                    BLOCK_K=max(16, min(128, triton.next_power_of_2(k))), GROUP_M=1, num_warps=4, num_stages=1)
    if block_m <= 16:
        return dict(BLOCK_N=64, BLOCK_K=128, GROUP_M=1, num_warps=4, num_stages=4)
    return dict(BLOCK_N=64, BLOCK_K=128, GROUP_M=1, num_warps=4, num_stages=3)


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


DECODE_MEAN_ROWS = 16  # mean rows per expert up to which a launch takes a fixed config


def grouped_gemm(a: torch.Tensor, w: torch.Tensor, out: torch.Tensor, align: Alignment, rows_per_a: int,
                 routing_weights: torch.Tensor = None) -> torch.Tensor:
    """out[pair] = a[pair // rows_per_a] @ w[expert(pair)].T (times routing_weights[pair] if given).

    a: [M_a, K]; w: [E, N, K] (rows are output features, as nn.Linear stores them); out: [n_pairs, N].
    """
    n_pairs = out.shape[0]
    num_experts, n, k = w.shape
    if n_pairs == 0:
        return out
    max_rows = align.sorted_pairs.numel()
    # float32 must not silently drop to TF32 on the GPU; Triton's interpreter multiplies bfloat16
    # tiles wrongly (it reads their raw bits), so off the GPU the tiles are upcast first (exact).
    f32_dot = a.dtype == torch.float32 or not a.is_cuda
    args = (a, w, out, routing_weights if routing_weights is not None else out, align.sorted_pairs,
            align.block_expert, align.padded_rows, n, k, n_pairs, max_rows,
            a.stride(0), a.stride(1), w.stride(0), w.stride(1), w.stride(2), out.stride(0), size_class(n_pairs))
    consts = dict(ROWS_PER_A=rows_per_a, MUL_WEIGHT=routing_weights is not None, BLOCK_M=align.block_m,
                  F32_DOT=f32_dot)
    if autotune_here(a) and n_pairs / num_experts > DECODE_MEAN_ROWS:
        grid = lambda meta: (triton.cdiv(max_rows, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)  # noqa: E731
        _tuned_gemm()[grid](*args, **consts)
    else:
        cfg = fixed_config(align.block_m, n, k, autotune_here(a))
        launch = {k_: cfg[k_] for k_ in ("BLOCK_N", "BLOCK_K", "GROUP_M")}
        grid = (triton.cdiv(max_rows, align.block_m) * triton.cdiv(n, cfg["BLOCK_N"]),)
        _moe_gemm_kernel[grid](*args, **consts, **launch, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return out


@functools.lru_cache(maxsize=None)
def _tuned_gemm():
    # Keyed on the GEMM shape, the expert count (via the tile count bucket) and the pair-count bucket.
    return triton.autotune(configs=_prefill_configs(), key=["N", "K", "size_cls", "BLOCK_M", "ROWS_PER_A"],
                           prune_configs_by={"early_config_prune": _prune})(_moe_gemm_kernel)


if triton is not None:

    @triton.jit(do_not_specialize=["size_cls"])
    def _moe_gemm_kernel(a_ptr, w_ptr, out_ptr, rw_ptr, sorted_pairs_ptr, block_expert_ptr, padded_rows_ptr,
                         N, K, n_pairs, max_rows,
                         stride_am, stride_ak, stride_we, stride_wn, stride_wk, stride_om, size_cls,
                         ROWS_PER_A: tl.constexpr, MUL_WEIGHT: tl.constexpr, F32_DOT: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         GROUP_M: tl.constexpr):
        # GROUP_M row tiles share each column sweep, so a weight tile is reused from L2 by the
        # tiles of the same expert that run at the same time.
        pid = tl.program_id(0)
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
        ks = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + a_row[:, None] * stride_am + ks[None, :] * stride_ak
        w_ptrs = w_ptr + expert * stride_we + cols[None, :].to(tl.int64) * stride_wn + ks[:, None] * stride_wk
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for step in range(0, tl.cdiv(K, BLOCK_K)):
            k_left = K - step * BLOCK_K
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
        out_ptrs = out_ptr + pair.to(tl.int64)[:, None] * stride_om + out_cols[None, :]
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=valid[:, None] & (out_cols < N)[None, :])
