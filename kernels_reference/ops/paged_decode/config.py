"""The decode kernels' configuration: ``DecodeConfig`` (why each field: the package docstring,
kernels_reference/ops/paged_decode/__init__.py), the shipped configs, and the shape-only launch
arithmetic (splits per sequence) that keeps the launch a function of shapes (CUDA-graph contract).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Optional

from ...triton_rows import splits_in_one_wave


LOG2E = 1.4426950408889634


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """Tuning knobs of the decode kernels (benchmarks/decode.py times them on the H200)."""

    # "one-pass": split-KV whose last split to finish merges, in the same launch, with as many
    # programs at a small batch as are resident at once (one wave). "two-pass": the earlier kernel
    # (contiguous split ranges, a second merge launch unless fused_merge), kept for comparison.
    kernel: str = "one-pass"
    blocks_per_iter: int = 4  # cache blocks (of block_size tokens) per loop iteration
    # Two-pass only: tokens per loop iteration when the batch is not split (its (sequence, kv head)
    # pairs fill the GPU by themselves), where that is more than blocks_per_iter gives; None: no
    # change. A split's short range wants short tiles (Llama-3.1-8B B32 C2048, two splits: 4
    # blocks of 16 tokens 77.5 us, 8 blocks 79.8); a whole sequence per program wants long ones
    # (B139 C1152 unsplit, side by side: 454 -> 436 us with 8 kv heads, 316 -> 253 with 4; H100,
    # 2026-12-06, docs/perf/h100-2026-12-06d.md). A power of two >= 16.
    unsplit_tile_tokens: Optional[int] = None
    num_warps: int = 8
    # Triton's software pipeline depth. With the block-table load ahead of the K/V loads, 5 is the
    # first depth at which Triton (3.9, sm_90) keeps two K/V tiles per program in flight.
    num_stages: int = 5
    # Split a batch until about this many programs per SM are in flight. A batch whose
    # (sequence, kv head) pairs do not fill the SMs (batch 1-16 of an 8-kv-head model on an H200)
    # is latency-bound: more, shorter splits help it; a batch that does fill them only pays for
    # splitting (workspace traffic, a merge), so it is split just enough to cover the SMs twice.
    # One-pass: a small batch is split to at most this many programs per SM *and* no more than fit
    # on an SM at once (from the compiled kernel's registers and shared memory), so there is no
    # second wave that would pay the whole latency chain again.
    programs_per_sm: int = 2
    small_batch_programs_per_sm: int = 4
    max_splits: int = 32  # one-pass: the merging program reads splits x group x head_size floats
    fused_merge: bool = False  # two-pass only: merge in the decode kernel (atomic counter)
    # Two-pass only (see the module docstring, "Batch-1 fixed cost"). interleaved: split s takes
    # tiles s, s+S, ... and its first block-table read waits on nothing (not on seq_len).
    interleaved: bool = False
    # Programmatic dependent launch: "off", "merge" (the merge kernel launches while the split
    # kernel runs), "all" (the split kernel too, after whatever kernel precedes it), or
    # "early-metadata" ("all", and seq_len / the first table entries are read before the wait), or
    # "small-batch" ("all" where the batch leaves SMs idle and PDL exists, else "off": a candidate
    # default, see small_batch_pdl).
    pdl: str = "off"
    # Two-pass split kernel: a register cap (Triton's maxnreg launch option), None for none. At
    # Llama-3.1-8B's shapes the default split kernel compiles to ~137 registers x 128 threads,
    # 3 programs per SM, so the 4-per-SM launch runs in two waves; 128 lets 4 fit at once.
    max_registers: Optional[int] = None
    # Two-pass merge kernel: programs per query head, each merging a slice of head_dim. 1 = one
    # program reads a head's every partial; more spread a many-split merge (one cache tile per
    # split at batch 1) over more SMs.
    merge_programs_per_head: int = 1
    # Kernel "blocks" only: how K/V reach shared memory. "pointers": Triton loads (cp.async when
    # pipelined); "tma": Hopper's tensor memory accelerator, one bulk copy per cache block through a
    # tensor descriptor (sm_90+, power-of-two kv heads and head size, one block per loop step).
    kv_loads: str = "pointers"


# The two-pass kernel's configuration (its H200 numbers: docs/perf/h200-attention.md and
# docs/perf/h200-decode-b1.md, where benchmarks/decode.py times it beside the one-pass kernel).


TWO_PASS_CONFIG = DecodeConfig(kernel="two-pass", blocks_per_iter=4, num_warps=4, num_stages=2, programs_per_sm=2,
                               small_batch_programs_per_sm=4, max_splits=128, fused_merge=False,
                               unsplit_tile_tokens=128)
ONE_PASS_CONFIG = DecodeConfig()
# Kernel "blocks" (blocks.py) in its best measured form, without PDL (a safe default:
# the PDL modes assume what the kernel before it writes); the H200 numbers quoted there are with
# pdl="early-metadata" (without PDL: B1 C8192 15.8 us, run 18).
BLOCKS_CONFIG = DecodeConfig(kernel="blocks", blocks_per_iter=1, num_warps=8, num_stages=3, programs_per_sm=2,
                             small_batch_programs_per_sm=1, max_splits=512, merge_programs_per_head=4)
DECODE_CONFIG = TWO_PASS_CONFIG
KERNELS = ("one-pass", "two-pass", "blocks")  # "blocks": blocks.py
PDL_MODES = ("off", "merge", "all", "early-metadata", "small-batch")


def decode_num_splits(num_seqs: int, num_kv_heads: int, max_blocks: int, num_sms: int,
                      config: DecodeConfig = DECODE_CONFIG, resident_per_sm: Optional[int] = None) -> int:
    """Splits per sequence, from shapes only: enough programs to fill the GPU, never more splits
    than a full-width block table has loop iterations (so a long sequence never has an idle split
    for lack of blocks), at least one. ``resident_per_sm``: programs of the compiled one-pass
    kernel that fit on one SM at once (None: unknown, the config's figure is trusted)."""
    programs = max(num_seqs * num_kv_heads, 1)
    iterations = max(-(-max_blocks // config.blocks_per_iter), 1)
    if config.kernel == "one-pass" and programs < num_sms:
        # Latency-bound: as many programs as run at once, rounded *down* so all start together.
        per_sm = config.small_batch_programs_per_sm
        if resident_per_sm:
            per_sm = min(per_sm, resident_per_sm)
        return splits_in_one_wave(programs, num_sms, per_sm, min(iterations, config.max_splits))
    else:
        per_sm = config.small_batch_programs_per_sm if programs < num_sms else config.programs_per_sm
        wanted = -(-per_sm * num_sms // programs)
    return max(1, min(wanted, iterations, config.max_splits))


@functools.lru_cache(maxsize=None)
def small_batch_pdl(config: DecodeConfig, programs: int, num_sms: int, pdl_usable: bool) -> DecodeConfig:
    """What pdl="small-batch" runs: "all" when the batch's (sequence, kv head) pairs leave SMs idle
    (B1-B16 of an 8-KV-head model on an H200), where the H200 measured it 2-10% faster than no PDL;
    "off" at larger batches (34% slower at B32 C2048: docs/perf/h200-decode-b1.md, run 3), where PDL
    is missing, off the GPU and under torch.compile. A function of shapes: graph-safe."""
    return dataclasses.replace(config, pdl="all" if pdl_usable and programs < num_sms else "off")


def decode_workspace_bytes(num_seqs: int, num_heads: int, head_dim: int, splits: int) -> int:
    """Bytes of the split workspace (partial outputs + log-sum-exps), for cost accounting."""
    return 0 if splits <= 1 else num_seqs * num_heads * splits * (head_dim + 1) * 4
