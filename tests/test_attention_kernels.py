"""The attention fast path (Triton KV store, Triton split-K paged decode, SDPA prefill) agrees with
``forward_native``, and the layer works under ``torch.compile(fullgraph=True)``.

On a CPU the Triton kernels run in the interpreter (the plugin sets ``TRITON_INTERPRET=1`` before
test modules are imported; it is set here too for a bare ``python -m pytest`` without CUDA).
"""
import copy
import dataclasses
import functools
import itertools
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from fk_pytest.compare import output_error  # noqa: E402
from kernels_reference.ops import paged_decode as decode_module  # noqa: E402
from kernels_reference.ops.paged_decode import blocks as decode_blocks  # noqa: E402
from kernels_reference.ops.paged_decode import decode as decode_entry  # noqa: E402
from kernels_reference.ops.paged_decode import merge as decode_merge  # noqa: E402
from kernels_reference.ops.launch_counters import counters_left_zero  # noqa: E402
from kernels_reference.ops.paged_decode import one_pass as decode_one_pass  # noqa: E402
from kernels_reference.ops.paged_decode import two_pass as decode_two_pass  # noqa: E402
from kernels_reference.L1.attention import Attention, paged_attention, store_kv_cache  # noqa: E402
from kernels_reference.ops.kv_store.store import store_kv_cache_triton  # noqa: E402
from kernels_reference.forward_context import AttentionMetadata, set_forward_context  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BLOCK = 16


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _metadata(context, query, gen, padded_rows=0):
    """Shuffled block tables (as after block-manager churn); ``padded_rows`` extra decode rows with
    seq_len 0 and slot -1, as a CUDA-graph batch pads its tail."""
    need = [-(-(c + q) // BLOCK) for c, q in zip(context, query)]
    order = torch.randperm(sum(need) + 3, generator=gen).tolist()
    tables, at = [], 0
    for n in need:
        tables.append(order[at: at + n])
        at += n
    meta = AttentionMetadata.build(context, query, BLOCK, device=DEVICE, block_tables=tables)
    if padded_rows:
        pad_table = torch.zeros(padded_rows, meta.block_tables.shape[1], dtype=torch.int32, device=DEVICE)
        meta = AttentionMetadata(
            query_start_loc=torch.arange(meta.num_seqs + padded_rows + 1, dtype=torch.int32, device=DEVICE),
            seq_lens=torch.cat([meta.seq_lens, torch.zeros(padded_rows, dtype=torch.int32, device=DEVICE)]),
            block_tables=torch.cat([meta.block_tables, pad_table]),
            slot_mapping=torch.cat([meta.slot_mapping, torch.full((padded_rows,), -1, device=DEVICE)]),
            block_size=BLOCK, max_query_len=1, max_seq_len=meta.max_seq_len,
            query_lens_cpu=meta.query_lens_cpu + (1,) * padded_rows,
            seq_lens_cpu=meta.seq_lens_cpu + (0,) * padded_rows)
    return meta, len(order)


def _step(nq, nk, d, context, query, dtype, seed=0, padded_rows=0, with_cache=True):
    gen = _gen(seed)
    meta, blocks = _metadata(context, query, gen, padded_rows)
    t = meta.slot_mapping.shape[0]
    qkv = torch.randn(t, (nq + 2 * nk) * d, generator=gen).to(device=DEVICE, dtype=dtype)
    q, k, v = qkv[:, : nq * d], qkv[:, nq * d: (nq + nk) * d], qkv[:, (nq + nk) * d:]  # strided views
    caches = None
    if with_cache:
        caches = tuple(torch.randn(blocks, BLOCK, nk, d, generator=gen).to(device=DEVICE, dtype=dtype) for _ in "kv")
    layer = Attention(nq, d, d ** -0.5, nk)
    return layer, meta, (q, k, v), caches


def _run(layer, meta, qkv, caches, method, upcast=False):
    """One call on private copies of the caches; returns (output, key cache, value cache)."""
    layer = copy.deepcopy(layer)
    conv = (lambda x: x.double()) if upcast else (lambda x: x)
    layer.kv_cache = None if caches is None else tuple(conv(c.clone()) for c in caches)
    with set_forward_context(meta), torch.no_grad():
        out = getattr(layer, method)(*(conv(x) for x in qkv))
    return (out,) + (layer.kv_cache or ())


def _check_fast_path(nq, nk, d, context, query, dtype, **kw):
    layer, meta, qkv, caches = _step(nq, nk, d, context, query, dtype, **kw)
    truth = _run(layer, meta, qkv, caches, "forward_native", upcast=True)
    native = _run(layer, meta, qkv, caches, "forward_native")
    fast = _run(layer, meta, qkv, caches, "forward_fast")
    assert fast[0].shape == native[0].shape and fast[0].dtype == native[0].dtype
    assert torch.isfinite(fast[0]).all()
    # Interpreted Triton truncates to bf16: allow for it as the suite does (truncating floor).
    err = output_error("out", truth[0], [native[0]], fast[0], dtype, truncating=True)
    assert err.passed(3.0), err
    for got, want in zip(fast[1:], native[1:]):  # the store is a copy: bit-exact
        assert torch.equal(got, want)
    return fast, native


# Kernel "blocks" (whole cache blocks per program, every head) with one block per loop step, so that
# on the interpreter's 4-SM stand-in a split runs several steps.
BLOCKS_SMALL = decode_module.DecodeConfig(kernel="blocks", blocks_per_iter=1, num_warps=4, num_stages=1,
                                          merge_programs_per_head=2)
# The same with K/V brought in by tensor-descriptor (TMA) loads; the interpreter runs them as gathers.
BLOCKS_TMA = dataclasses.replace(BLOCKS_SMALL, kv_loads="tma")
KERNEL_CONFIGS = {"one-pass": decode_module.ONE_PASS_CONFIG, "two-pass": decode_module.TWO_PASS_CONFIG,
                  "blocks": BLOCKS_SMALL, "blocks-tma": BLOCKS_TMA}


@pytest.mark.parametrize("kernel", list(KERNEL_CONFIGS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads", [(8, 2), (4, 4)], ids=["gqa4", "mha"])
def test_decode_batch_matches_native(dtype, heads, kernel, monkeypatch):
    # contexts not multiples of the block size, one shorter than a block, one spanning many blocks
    monkeypatch.setattr(decode_entry, "DECODE_CONFIG", KERNEL_CONFIGS[kernel])
    _check_fast_path(*heads, 64, [40, 17, 63, 3, 100], [1] * 5, dtype)


# The one-pass kernel with one block per tile, so that on the interpreter's 4-SM stand-in a few
# sequences split several ways and every split runs several tiles (interleaved, merged in-launch).
ONE_PASS_SMALL_TILES = dataclasses.replace(decode_module.ONE_PASS_CONFIG, blocks_per_iter=1)


@pytest.mark.parametrize("group", range(1, 9))
def test_one_pass_every_gqa_group(group, monkeypatch):
    # 3 sequences x 1 kv head on 4 "SMs": 5 splits; odd contexts, one empty-tailed, shuffled tables
    monkeypatch.setattr(decode_entry, "DECODE_CONFIG", ONE_PASS_SMALL_TILES)
    _check_fast_path(group, 1, 64, [70, 17, 40], [1, 1, 1], torch.bfloat16, seed=group)


@pytest.mark.parametrize("group", [1, 3, 4, 8])
@pytest.mark.parametrize("num_kv", [1, 3, 8])
def test_blocks_kernel_every_head_layout(group, num_kv, monkeypatch):
    """Kernel "blocks" computes each query head from its own kv head's rows of a whole-block tile
    (a batched dot per kv head); kv head counts that are not powers of two pad the dot's batch,
    groups pad the query rows. Two steps of two blocks per split. The merge kernel takes a whole
    head per program: its grid is every query head (up to 64 here), and slicing heads over more
    programs is the merge's own test (test_merge_in_steps_and_slices_of_head_dim)."""
    config = dataclasses.replace(BLOCKS_SMALL, blocks_per_iter=2, small_batch_programs_per_sm=1,
                                 merge_programs_per_head=1)
    monkeypatch.setattr(decode_entry, "DECODE_CONFIG", config)
    _check_fast_path(group * num_kv, num_kv, 32, [150, 17, 5], [1, 1, 1], torch.bfloat16, seed=group + num_kv,
                     padded_rows=1)


def test_blocks_splits_are_whole_steps_from_shapes():
    from kernels_reference.ops.paged_decode.blocks import blocks_num_splits
    config = decode_module.DecodeConfig(kernel="blocks", blocks_per_iter=2, small_batch_programs_per_sm=2,
                                        programs_per_sm=1, max_splits=512)
    assert blocks_num_splits(1, 512, 132, config) == (256, 2)  # 264 wanted, 256 two-block splits
    assert blocks_num_splits(1, 513, 132, config) == (257, 2)
    assert blocks_num_splits(1, 5, 132, config) == (3, 2)  # never a split without table entries
    assert blocks_num_splits(32, 128, 132, config) == (8, 16)  # 9 wanted: 15 blocks -> 16 (whole steps) -> 8
    assert blocks_num_splits(200, 64, 132, config) == (1, 64)  # the sequences fill the SMs
    assert blocks_num_splits(1, 512, 132, dataclasses.replace(config, max_splits=16)) == (16, 32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_one_pass_half_and_single_precision(dtype, monkeypatch):
    monkeypatch.setattr(decode_entry, "DECODE_CONFIG", ONE_PASS_SMALL_TILES)
    _check_fast_path(6, 2, 64, [53, 9], [1, 1], dtype, padded_rows=1)


def test_one_pass_head_dim_128_long_single_sequence():
    # Llama-3.1-8B's group of 4 at d 128, batch 1 over 19 blocks: the default config's own split count
    _check_fast_path(4, 1, 128, [300], [1], torch.bfloat16)


def test_one_pass_batch_128_without_splits():
    """A batch that fills the SMs: one split per (sequence, kv head), the output written directly.
    Called directly (not through the layer) and checked against a batched float64 evaluation: at
    128 sequences the interpreter's per-program cost is what a test pays."""
    gen = _gen(4)
    batch, nq, nk, d, width = 128, 2, 1, 32, 2
    lens = torch.tensor([(7 * i) % 23 for i in range(batch)], dtype=torch.int32)  # 0 (padded row) .. 22
    tables = torch.randperm(batch * width + 5, generator=gen)[: batch * width].view(batch, width).to(torch.int32)
    k_cache, v_cache = (torch.randn(batch * width + 5, BLOCK, nk, d, generator=gen).to(torch.bfloat16) for _ in "kv")
    q = torch.randn(batch, nq, d, generator=gen).to(torch.bfloat16)
    assert decode_one_pass.one_pass_plan(q, k_cache, tables)["splits"] == 1
    got = decode_module.paged_decode(q, k_cache, v_cache, tables, lens, d ** -0.5)
    ks, vs = (c[tables.long()].flatten(1, 2).double() for c in (k_cache, v_cache))  # [B, width*16, nk, d]
    scores = torch.einsum("bhd,btd->bht", q.double(), ks[:, :, 0]) * d ** -0.5
    scores = scores.masked_fill(torch.arange(width * BLOCK)[None, None, :] >= lens[:, None, None].long(), float("-inf"))
    want = torch.einsum("bht,btd->bhd", torch.softmax(scores, -1).nan_to_num(0.0), vs[:, :, 0])
    assert torch.count_nonzero(got[lens == 0]) == 0 and torch.isfinite(got).all()
    rel = torch.linalg.vector_norm(got.double() - want) / torch.linalg.vector_norm(want)
    assert rel < 2 ** -7, rel  # bfloat16 output (8 bits of mantissa), bfloat16 P in P@V, interpreter truncation


def test_decode_head_dim_128_grouped_query_7():
    _check_fast_path(28, 4, 128, [70, 33], [1, 1], torch.bfloat16)  # Qwen2.5-7B's 28/4 heads


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_padded_decode_row_gives_zeros_and_stores_nothing(dtype):
    fast, native = _check_fast_path(8, 2, 64, [40, 17], [1, 1], dtype, padded_rows=2)
    assert torch.count_nonzero(fast[0][2:]) == 0


SPLIT_VARIANTS = {
    "two-pass-merge-kernel": dataclasses.replace(decode_module.TWO_PASS_CONFIG, blocks_per_iter=1),
    # (the shipped config widens an unsplit launch's tile to 128 tokens; this one keeps 1 block)
    "two-pass-one-block-unsplit": dataclasses.replace(decode_module.TWO_PASS_CONFIG, blocks_per_iter=1,
                                                      unsplit_tile_tokens=None),
    "two-pass-fused-merge": dataclasses.replace(decode_module.TWO_PASS_CONFIG, blocks_per_iter=1, fused_merge=True),
    "one-pass": ONE_PASS_SMALL_TILES,
    "two-pass-interleaved": dataclasses.replace(decode_module.TWO_PASS_CONFIG, blocks_per_iter=1, interleaved=True),
    # On the CPU the PDL modes run without the grid-dependency instructions, but with their load
    # order (early-metadata: seq_len and the first table entries before q).
    "two-pass-interleaved-early-metadata": dataclasses.replace(decode_module.TWO_PASS_CONFIG, blocks_per_iter=1,
                                                               interleaved=True, pdl="early-metadata"),
    "two-pass-contiguous-early-metadata": dataclasses.replace(decode_module.TWO_PASS_CONFIG, blocks_per_iter=1,
                                                              pdl="early-metadata"),
    "blocks": BLOCKS_SMALL,
    "blocks-early-metadata": dataclasses.replace(BLOCKS_SMALL, pdl="early-metadata"),
    "blocks-shipped-config": decode_module.BLOCKS_CONFIG,
    "blocks-tma": BLOCKS_TMA,
    "blocks-tma-early-metadata": dataclasses.replace(BLOCKS_TMA, pdl="early-metadata"),
    # The merge spread over 4 programs per head, each merging 8 of head_dim 32.
    "two-pass-merge-4-per-head": dataclasses.replace(decode_module.TWO_PASS_CONFIG, blocks_per_iter=1,
                                                     interleaved=True, merge_programs_per_head=4),
}


@functools.lru_cache(maxsize=None)
def _uneven_partitions_case():
    """The inputs of ``test_decode_splits_agree_with_uneven_partitions`` and their single-split
    output: the same for all of its 60 cases, so the unsplit launch (about a third of each case's
    interpreted time) runs once per process. Nothing here is written by ``paged_decode``."""
    gen = _gen(1)
    nq, nk, d, lens = 8, 2, 32, [100, 3, 0, 49]
    tables = torch.randperm(40, generator=gen)[:4 * 8].view(4, 8).to(DEVICE, torch.int32)
    k_cache, v_cache = (torch.randn(40, BLOCK, nk, d, generator=gen).to(DEVICE) for _ in "kv")
    q = torch.randn(4, nq, d, generator=gen).to(DEVICE)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    ones = decode_module.paged_decode(q, k_cache, v_cache, tables, seq_lens, 0.3,
                                      config=decode_module.TWO_PASS_CONFIG, num_splits=1)
    return nq, nk, lens, q, k_cache, v_cache, tables, seq_lens, ones


@pytest.mark.parametrize("variant", list(SPLIT_VARIANTS))
@pytest.mark.parametrize("splits", [1, 2, 3, 5, 8])
def test_decode_splits_agree_with_uneven_partitions(splits, variant):
    # 100 tokens = 7 blocks: uneven shares; 3 tokens: one block, most splits empty; 0: no work at all;
    # one block per iteration so a split runs several iterations (the table prefetch is exercised)
    config = SPLIT_VARIANTS[variant]
    fused_merge = config.fused_merge or config.kernel == "one-pass"
    nq, nk, lens, q, k_cache, v_cache, tables, seq_lens, ones = _uneven_partitions_case()
    # Twice where a launch leaves state for the next: the fused merge's counters must be back at
    # zero. Without them (no fused merge, or one split) a launch reads nothing of the one before.
    for _ in range(2 if fused_merge and splits > 1 else 1):
        split = decode_module.paged_decode(q, k_cache, v_cache, tables, seq_lens, 0.3, config=config,
                                           num_splits=splits)
        assert torch.isfinite(split).all() and torch.count_nonzero(split[2]) == 0
    if fused_merge and splits > 1:
        assert counters_left_zero("paged_decode_merge")
    torch.testing.assert_close(split, ones, rtol=1e-5, atol=1e-6)
    for i, n in enumerate(lens[:2]):  # against a direct float64 evaluation
        blocks = tables[i, : -(-n // BLOCK)].long()
        ks = k_cache[blocks].flatten(0, 1)[:n].double().repeat_interleave(nq // nk, 1)
        vs = v_cache[blocks].flatten(0, 1)[:n].double().repeat_interleave(nq // nk, 1)
        probs = torch.softmax(torch.einsum("hd,khd->hk", q[i].double(), ks) * 0.3, -1)
        torch.testing.assert_close(split[i].double(), torch.einsum("hk,khd->hd", probs, vs), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("programs_per_head", [1, 2, 64])
def test_merge_in_steps_and_slices_of_head_dim(programs_per_head, monkeypatch):
    """The merge kernel with few partial floats per step (a full head: 2 splits per step, so a
    running max over 4 steps; half a head: 4 per step) and head_dim 40 (not a power of two) cut into 1, 2 or 64 slices
    (64 > head_dim's padded 64 / 2: slices of one element, those past 40 not launched): the same
    output as the single-split kernel."""
    monkeypatch.setattr(decode_merge, "MERGE_STEP_FLOATS", 128)
    config = dataclasses.replace(decode_module.TWO_PASS_CONFIG, blocks_per_iter=1,
                                 merge_programs_per_head=programs_per_head)
    gen = _gen(3)
    nq, nk, d, lens = 4, 1, 40, [100, 7, 0]
    tables = torch.randperm(24, generator=gen)[:3 * 7].view(3, 7).to(DEVICE, torch.int32)
    k_cache, v_cache = (torch.randn(24, BLOCK, nk, d, generator=gen).to(DEVICE) for _ in "kv")
    q = torch.randn(3, nq, d, generator=gen).to(DEVICE)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    chunks, meta = decode_merge.merge_launch(7, d, 64, programs_per_head, False)
    assert meta["SPLIT_CHUNK"] * meta["DIM_CHUNK"] <= 128 and chunks * meta["DIM_CHUNK"] >= d
    assert (meta["SPLIT_CHUNK"] < 7) == (programs_per_head < 64) == (not meta["ONE_STEP"])  # steps unless tiny slices
    ones = decode_module.paged_decode(q, k_cache, v_cache, tables, seq_lens, 0.3, num_splits=1)
    split = decode_module.paged_decode(q, k_cache, v_cache, tables, seq_lens, 0.3, config=config, num_splits=7)
    assert torch.count_nonzero(split[2]) == 0
    torch.testing.assert_close(split, ones, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("variant", ["blocks", "blocks-tma", "two-pass-merge-kernel"])
def test_cache_past_seq_len_never_reaches_the_output(variant):
    """A cache block's slots past seq_len hold whatever was there (NaN here): the kernels mask the
    scores and never multiply those V rows in, even TMA, which copies whole blocks unmasked."""
    gen = _gen(9)
    nq, nk, d, lens = 8, 2, 32, [37, 16, 5]
    tables = torch.randperm(12, generator=gen)[:3 * 3].view(3, 3).to(DEVICE, torch.int32)
    k_cache, v_cache = (torch.randn(12, BLOCK, nk, d, generator=gen).to(DEVICE) for _ in "kv")
    for i, n in enumerate(lens):  # poison every slot past each sequence's end in its last block
        last, used = tables[i, (n - 1) // BLOCK].long(), n % BLOCK
        if used:
            k_cache[last, used:] = float("nan")
            v_cache[last, used:] = float("nan")
    q = torch.randn(3, nq, d, generator=gen).to(DEVICE)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    got = decode_module.paged_decode(q, k_cache, v_cache, tables, seq_lens, 0.3, config=SPLIT_VARIANTS[variant],
                                     num_splits=2)
    assert torch.isfinite(got).all()
    for i, n in enumerate(lens):
        blocks = tables[i, : -(-n // BLOCK)].long()
        ks = k_cache[blocks].flatten(0, 1)[:n].double().repeat_interleave(nq // nk, 1)
        vs = v_cache[blocks].flatten(0, 1)[:n].double().repeat_interleave(nq // nk, 1)
        probs = torch.softmax(torch.einsum("hd,khd->hk", q[i].double(), ks) * 0.3, -1)
        torch.testing.assert_close(got[i].double(), torch.einsum("hk,khd->hd", probs, vs), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("nk, d, change, reason", [
    (3, 32, {}, "num_kv_heads 3 is not a power of two"),
    (2, 40, {}, "head_size 40 is not a power of two"),
    (2, 32, {"blocks_per_iter": 2}, "blocks_per_iter is 2, TMA loads one block per step"),
])
def test_tma_loads_refuse_shapes_they_cannot_copy(nk, d, change, reason):
    q = torch.zeros(1, 2 * nk, d, device=DEVICE)
    cache = torch.zeros(2, BLOCK, nk, d, device=DEVICE)
    with pytest.raises(ValueError, match=reason):
        decode_module.paged_decode(q, cache, cache, torch.zeros(1, 2, dtype=torch.int32, device=DEVICE),
                                   torch.ones(1, dtype=torch.int32, device=DEVICE), 0.1,
                                   config=dataclasses.replace(BLOCKS_TMA, **change))
    with pytest.raises(ValueError, match="kv_loads='tma' is an option of kernel 'blocks'"):
        decode_module.paged_decode(q, cache, cache, torch.zeros(1, 2, dtype=torch.int32, device=DEVICE),
                                   torch.ones(1, dtype=torch.int32, device=DEVICE), 0.1,
                                   config=dataclasses.replace(decode_module.TWO_PASS_CONFIG, kv_loads="tma"))


@pytest.mark.parametrize("change, reason", [
    ({"merge_programs_per_head": 3}, "merge_programs_per_head must be a power of two, got 3"),
    ({"unsplit_tile_tokens": 100}, "unsplit_tile_tokens must be a power of two >= 16 \\(or None\\), got 100"),
])
def test_launch_knobs_are_validated(change, reason):
    q = torch.zeros(1, 4, 32)
    cache = torch.zeros(2, BLOCK, 1, 32)
    with pytest.raises(ValueError, match=reason):
        decode_module.paged_decode(q, cache, cache, torch.zeros(1, 2, dtype=torch.int32), torch.ones(1, dtype=torch.int32),
                                   0.1, config=dataclasses.replace(decode_module.TWO_PASS_CONFIG, **change))


# The batch-1 fixed-cost variants (module docstring). programs_per_sm 8 so that the layer's batch
# (12 programs on the interpreter's 4-SM stand-in) is split 3 ways; one block per tile so that a split
# runs several tiles (interleaved: tiles s, s+3, ...).
_FEW_SM_SPLITS = dataclasses.replace(decode_module.TWO_PASS_CONFIG, blocks_per_iter=1, programs_per_sm=8)
FIXED_COST_VARIANTS = {
    "interleaved": dataclasses.replace(_FEW_SM_SPLITS, interleaved=True),
    "pdl-merge": dataclasses.replace(_FEW_SM_SPLITS, pdl="merge"),
    "pdl-all": dataclasses.replace(_FEW_SM_SPLITS, pdl="all"),
    "interleaved-pdl-all": dataclasses.replace(_FEW_SM_SPLITS, interleaved=True, pdl="all"),
    "interleaved-early-metadata": dataclasses.replace(_FEW_SM_SPLITS, interleaved=True, pdl="early-metadata"),
    "max-registers": dataclasses.replace(_FEW_SM_SPLITS, max_registers=128),  # a launch option: GPU only
    "pdl-small-batch": dataclasses.replace(_FEW_SM_SPLITS, pdl="small-batch"),
}


def test_small_batch_pdl_is_all_only_while_the_batch_leaves_sms_idle():
    base = decode_module.TWO_PASS_CONFIG
    assert decode_module.small_batch_pdl(base, 8, 132, True).pdl == "all"  # B1 of 8 kv heads
    assert decode_module.small_batch_pdl(base, 256, 132, True).pdl == "off"  # B32: measured slower
    assert decode_module.small_batch_pdl(base, 8, 132, False).pdl == "off"  # no PDL here
    assert decode_module.small_batch_pdl(base, 8, 132, True).num_warps == base.num_warps  # nothing else changes


@pytest.mark.parametrize("variant", list(FIXED_COST_VARIANTS))
def test_fixed_cost_variants_match_native(variant, monkeypatch):
    # GQA 4, uneven contexts (one under a block, one of many blocks), a padded row (seq_len 0); the
    # block table is as wide as the longest sequence, so the short rows' tables are wider than them
    config = FIXED_COST_VARIANTS[variant]
    monkeypatch.setattr(decode_entry, "DECODE_CONFIG", config)
    layer, meta, qkv, caches = _step(8, 2, 64, [70, 9, 40, 33, 100], [1] * 5, torch.bfloat16, seed=7, padded_rows=1)
    assert decode_module.decode_num_splits(6, 2, meta.block_tables.shape[1], 4, config) == 3
    fast, native = _check_fast_path(8, 2, 64, [70, 9, 40, 33, 100], [1] * 5, torch.bfloat16, seed=7, padded_rows=1)
    assert torch.count_nonzero(fast[0][5:]) == 0


@pytest.mark.parametrize("variant", ["two-pass-interleaved", "two-pass-interleaved-early-metadata",
                                     "blocks", "blocks-early-metadata", "blocks-tma"])
@pytest.mark.parametrize("splits", [None, 2, 13])
def test_interleaved_splits_with_a_table_wider_than_the_sequences(variant, splits):
    """The interleaved (and "blocks") first table read is bounded by the table's width only, so it reads entries
    past the sequence: here they hold block numbers far outside the cache, which must never be
    dereferenced (K/V loads are masked by seq_len). 13 splits: more than the longest sequence has
    blocks (most splits read only such entries and write an empty partial). None: the shape rule,
    which on a table 5x wider than the sequences still gives every split work."""
    config = SPLIT_VARIANTS[variant]
    gen = _gen(5)
    nq, nk, d, lens, width = 8, 2, 32, [100, 3, 0, 49], 40
    num_blocks = 30
    tables = torch.full((4, width), 2 ** 30, dtype=torch.int32)  # garbage: block 2^30 does not exist
    for i, n in enumerate(lens):
        used = -(-n // BLOCK)
        tables[i, :used] = torch.randperm(num_blocks, generator=gen)[:used].to(torch.int32)
    k_cache, v_cache = (torch.randn(num_blocks, BLOCK, nk, d, generator=gen).to(DEVICE) for _ in "kv")
    q = torch.randn(4, nq, d, generator=gen).to(DEVICE)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    tables = tables.to(DEVICE)
    got = decode_module.paged_decode(q, k_cache, v_cache, tables, seq_lens, 0.3, config=config, num_splits=splits)
    assert torch.isfinite(got).all() and torch.count_nonzero(got[2]) == 0
    for i, n in enumerate(lens):
        if n == 0:
            continue
        blocks = tables[i, : -(-n // BLOCK)].long()
        ks = k_cache[blocks].flatten(0, 1)[:n].double().repeat_interleave(nq // nk, 1)
        vs = v_cache[blocks].flatten(0, 1)[:n].double().repeat_interleave(nq // nk, 1)
        probs = torch.softmax(torch.einsum("hd,khd->hk", q[i].double(), ks) * 0.3, -1)
        torch.testing.assert_close(got[i].double(), torch.einsum("hk,khd->hd", probs, vs), rtol=1e-5, atol=1e-6)


def test_variant_options_are_validated():
    q = torch.zeros(1, 4, 32)
    cache = torch.zeros(2, BLOCK, 1, 32)
    args = (q, cache, cache, torch.zeros(1, 2, dtype=torch.int32), torch.ones(1, dtype=torch.int32), 0.1)
    with pytest.raises(ValueError, match="pdl mode"):
        decode_module.paged_decode(*args, config=dataclasses.replace(decode_module.TWO_PASS_CONFIG, pdl="yes"))
    for change in (dict(pdl="all"), dict(interleaved=True), dict(max_registers=128)):
        with pytest.raises(ValueError, match="two-pass"):
            decode_module.paged_decode(*args, config=dataclasses.replace(decode_module.ONE_PASS_CONFIG, **change))
    assert decode_module.pdl_unavailable_reason(torch.device("cpu"))  # the interpreter: compiled out, said so


def test_pdl_variant_refused_where_unavailable(monkeypatch):
    """On a CUDA device whose Triton lacks PDL, a PDL config raises VariantUnavailable (the H200
    sweep reports the row as unavailable) instead of running the plain kernel under its name."""
    monkeypatch.setattr(decode_entry, "pdl_unavailable_reason", lambda device: "no launch_pdl in this Triton")
    q = torch.zeros(1, 4, 32)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    cache = torch.zeros(2, BLOCK, 1, 32)
    with pytest.raises(decode_module.VariantUnavailable, match="launch_pdl"):
        decode_module.paged_decode(q, cache, cache, torch.zeros(1, 2, dtype=torch.int32), torch.ones(1, dtype=torch.int32),
                                   0.1, config=dataclasses.replace(decode_module.TWO_PASS_CONFIG, pdl="merge"))


def test_variants_compile_for_sm90_with_pdl_order():
    """Every structural variant compiled for sm_90 by Triton's compiler (no GPU needed; the
    interpreter accepts code the compiler may not), and the PDL order read from the PTX: no
    global load or store before griddepcontrol.wait except early-metadata's seq_len / table reads,
    the merge kernel waits before reading partials, and the default kernel has no PDL at all."""
    import json
    import subprocess
    import sys
    if not os.path.exists(os.path.join(os.path.dirname(__import__("triton").__file__), "backends", "nvidia")):
        pytest.skip("this Triton has no NVIDIA backend")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    run = subprocess.run([sys.executable, os.path.join(root, "tools", "decode_sm90_compile.py"), "--json"],
                         capture_output=True, text=True, env=env, timeout=600)
    if run.returncode == 3:  # another Triton's ahead-of-time API (the tool says which): nothing to check
        pytest.skip(run.stdout.strip()[-300:])
    rows = {r["variant"]: r for r in map(json.loads, filter(None, run.stdout.splitlines()))}
    assert rows and all("error" not in r for r in rows.values()), run.stdout + run.stderr[-3000:]
    default = rows["default"]
    assert not (default["split"]["wait"] or default["split"]["launch_dependents"] or default["split"]["launch_pdl"])
    assert not (default["merge"]["wait"] or default["merge"]["launch_pdl"])
    for name in ("pdl merge", "pdl all", "interleaved pdl all", "interleaved pdl early-metadata"):
        merge = rows[name]["merge"]
        assert merge["launch_pdl"] and merge["wait"] and merge["loads_before_wait"] == 0, (name, merge)
        assert merge["stores_before_wait"] == 0 and rows[name]["split"]["launch_dependents"], name
    assert not rows["pdl merge"]["split"]["launch_pdl"] and not rows["pdl merge"]["split"]["wait"]
    for name in ("pdl all", "interleaved pdl all"):
        split = rows[name]["split"]
        assert split["launch_pdl"] and split["wait"] and split["loads_before_wait"] == split["stores_before_wait"] == 0
    early = rows["interleaved pdl early-metadata"]["split"]
    assert early["launch_pdl"] and early["stores_before_wait"] == 0
    assert 0 < early["loads_before_wait"] < early["loads_total"]  # metadata only: q and K/V after the wait
    capped = rows["maxnreg 128"]["split"]
    if capped.get("regs") is not None:
        assert capped["regs"] <= 128 < rows["default"]["split"]["regs"]


@pytest.mark.parametrize("kernel", list(KERNEL_CONFIGS))
def test_decode_launch_depends_on_shapes_not_metadata_values(monkeypatch, kernel):
    """The CUDA-graph contract: same shapes, different seq_lens -> the same grid and workspace."""
    grids = []
    module = decode_blocks if kernel.startswith("blocks") else {"one-pass": decode_one_pass, "two-pass": decode_two_pass}[kernel]
    name = {"one-pass": "_decode_one_pass_kernel", "two-pass": "_paged_decode_kernel"}.get(kernel, "_decode_blocks_kernel")
    real = getattr(module, name)

    class Recorder:
        def __getitem__(self, grid):
            grids.append(grid)
            return real[grid]

    monkeypatch.setattr(module, name, Recorder())
    monkeypatch.setattr(decode_entry, "DECODE_CONFIG", KERNEL_CONFIGS[kernel])
    gen = _gen(2)
    tables = torch.randperm(64, generator=gen)[:2 * 16].view(2, 16).to(DEVICE, torch.int32)
    k_cache, v_cache = (torch.randn(64, BLOCK, 2, 32, generator=gen).to(DEVICE) for _ in "kv")
    q = torch.randn(2, 4, 32, generator=gen).to(DEVICE)
    for lens in ([256, 1], [5, 0], [130, 200]):
        decode_module.paged_decode(q, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32, device=DEVICE), 0.2)
    assert len(set(grids)) == 1 and grids[0][-1] > 1, grids  # the splits axis


@pytest.mark.parametrize("splits, tile_blocks", [(1, 128 // BLOCK), (2, 4)])
def test_two_pass_takes_the_wide_tile_only_when_it_does_not_split(monkeypatch, splits, tile_blocks):
    """An unsplit launch walks whole sequences in 128-token steps; a split one keeps the config's
    4 blocks (its ranges are short): the tile is chosen from the split count, a shape."""
    nq, nk, lens, q, k_cache, v_cache, tables, seq_lens, ones = _uneven_partitions_case()  # (launches once)
    launches = []
    real = decode_two_pass._paged_decode_kernel

    class Recorder:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append(kwargs["BLOCKS_PER_ITER"])
                return real[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(decode_two_pass, "_paged_decode_kernel", Recorder())
    out = decode_module.paged_decode(q, k_cache, v_cache, tables, seq_lens, 0.3,
                                     config=decode_module.TWO_PASS_CONFIG, num_splits=splits)
    assert launches == [tile_blocks]
    torch.testing.assert_close(out, ones, rtol=1e-5, atol=1e-6)


def test_decode_splits_favour_small_batches():
    """Few (sequence, kv head) pairs: more, shorter splits; a batch that fills the SMs: fewer;
    never more splits than a full table has loop iterations, nor than max_splits."""
    config = decode_module.DecodeConfig(blocks_per_iter=4, programs_per_sm=2, small_batch_programs_per_sm=4,
                                        max_splits=128)
    splits = functools.partial(decode_module.decode_num_splits, num_kv_heads=8, num_sms=132, config=config)
    assert splits(1, max_blocks=512) == 66  # 4 * 132 / 8 programs
    assert splits(32, max_blocks=128) == 2  # 256 programs: 2 * 132 / 256 rounded up
    assert splits(256, max_blocks=32) == 1
    assert splits(1, max_blocks=8) == 2  # 8 blocks = 2 iterations of 4
    assert decode_module.decode_num_splits(1, 1, 10 ** 6, 132, dataclasses.replace(config, max_splits=16)) == 16


def test_one_pass_splits_stay_within_one_resident_wave():
    """One-pass at a small batch: programs rounded *down* to what fits at once (a second wave would
    pay the whole latency chain again), capped by the compiled kernel's residency and max_splits."""
    config = decode_module.DecodeConfig(kernel="one-pass", blocks_per_iter=4, small_batch_programs_per_sm=4,
                                        programs_per_sm=2, max_splits=128)
    splits = functools.partial(decode_module.decode_num_splits, num_kv_heads=8, num_sms=132, config=config)
    assert splits(1, max_blocks=512) == 66  # 528 programs = 4 per SM
    assert splits(1, max_blocks=512, resident_per_sm=3) == 49  # 392 programs <= 396 slots (50 would not fit)
    assert splits(5, max_blocks=512) == 13  # 520 programs (14 splits: 560 > 528)
    assert splits(32, max_blocks=128) == 2  # the SMs are full: the two-pass rule
    assert decode_module.decode_num_splits(1, 8, 512, 132, decode_module.ONE_PASS_CONFIG) == min(decode_module.ONE_PASS_CONFIG.max_splits, 66)


def test_resident_programs_from_the_compiled_footprint(monkeypatch):
    """Registers (per warp, 256 at a time), shared memory (+1 KiB per block) and threads per SM: the
    footprint rule the one-pass decode sizes its persistent grid by and GRN plans its reduction's
    splits by."""
    import types

    from kernels_reference.triton_rows import resident_programs_per_sm
    props = types.SimpleNamespace(regs_per_multiprocessor=65536, shared_memory_per_multiprocessor=233472,
                                  max_threads_per_multi_processor=2048)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)

    def compiled(regs, shared, warps):
        kernel = types.SimpleNamespace(_init_handles=lambda: None, n_regs=regs,
                                       metadata=types.SimpleNamespace(shared=shared, num_warps=warps))
        return lambda: kernel

    resident = resident_programs_per_sm
    assert resident(compiled(107, 38912, 4), "cuda") == 4  # registers: 112 x 128 threads per program
    assert resident(compiled(121, 72192, 8), "cuda") == 2  # registers: 128 x 256 threads
    assert resident(compiled(80, 140288, 8), "cuda") == 1  # shared memory
    assert resident(compiled(32, 1024, 4), "cuda") == 16  # threads: 2048 / 128
    assert resident(lambda: types.SimpleNamespace(_init_handles=lambda: 1 / 0), "cuda") is None  # an unknown Triton: the config's figure is used


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch", ["prefill", "chunked", "mixed", "equal-prompts"])
def test_prefill_chunked_and_mixed_batches_match_native(dtype, batch):
    # equal-prompts: runs of fresh prompts of one length (attended as one batch each), split by a
    # chunk with context, a prompt of another length and a decode row
    context, query = {"prefill": ([0, 0], [12, 5]), "chunked": ([33], [17]),
                      "mixed": ([0, 21, 30, 7], [9, 6, 1, 1]),
                      "equal-prompts": ([0, 0, 0, 5, 0, 0, 0, 40], [8, 8, 8, 3, 8, 8, 4, 1])}[batch]
    _check_fast_path(8, 2, 64, context, query, dtype)


def test_packed_prefill_without_a_cache():
    _check_fast_path(4, 2, 32, [0, 0], [7, 3], torch.float32, with_cache=False)
    _check_fast_path(4, 2, 32, [0, 0, 0], [7, 7, 7], torch.float32, with_cache=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_store_skips_negative_slots_and_reads_strided_rows(dtype):
    gen = _gen(3)
    nk, d = 2, 64
    qkv = torch.randn(5, (4 + 2 * nk) * d, generator=gen).to(DEVICE, dtype)
    k, v = qkv[:, 4 * d: (4 + nk) * d], qkv[:, (4 + nk) * d:]
    caches = [torch.randn(6, BLOCK, nk, d, generator=gen).to(DEVICE, dtype) for _ in range(2)]
    caches += [c.clone() for c in caches]
    slots = torch.tensor([3, 17, -1, 95, 40], device=DEVICE)
    store_kv_cache(k, v, caches[0], caches[1], slots)
    store_kv_cache_triton(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[2], caches[0]) and torch.equal(caches[3], caches[1])
    assert torch.equal(caches[0].view(-1, nk, d)[95], k[3].view(nk, d))


def test_compiled_layer_uses_one_graph_across_steps():
    """torch.compile(fullgraph=True): the layer is one opaque op, metadata values are no guards."""
    torch._dynamo.reset()
    compiled_graphs = []

    def backend(gm, example_inputs):
        compiled_graphs.append(gm)
        return gm.forward

    layer, meta, qkv, caches = _step(8, 2, 32, [40, 17, 63], [1, 1, 1], torch.float32)
    compiled = torch.compile(layer, fullgraph=True, backend=backend)
    graphs_after = {}
    # steps 0 and 1: the same shapes, other lengths and block tables; step 2: new shapes
    for seed, context in enumerate(([40, 17, 63], [41, 18, 62], [90, 2, 30])):
        _, meta, qkv, caches = _step(8, 2, 32, context, [1, 1, 1], torch.float32, seed=seed)
        want = _run(layer, meta, qkv, caches, "forward_native")
        layer.kv_cache = tuple(c.clone() for c in caches)
        with set_forward_context(meta), torch.no_grad():
            got = compiled(*qkv)
        torch.testing.assert_close(got, want[0])
        assert torch.equal(layer.kv_cache[0], want[1]) and torch.equal(layer.kv_cache[1], want[2])
        graphs_after[seed] = len(compiled_graphs)
    assert graphs_after[1] == 1  # new metadata values: no recompile
    assert graphs_after[2] <= 2  # new shapes: at most the one dynamic-shape recompile
    assert any("paged_attention" in str(n.target) for n in compiled_graphs[0].graph.nodes)


def test_compiled_with_inductor_prefill_step():
    torch._dynamo.reset()
    layer, meta, qkv, caches = _step(4, 2, 32, [0, 21], [9, 6], torch.float32)
    want = _run(layer, meta, qkv, caches, "forward_native")
    compiled = torch.compile(layer, fullgraph=True)
    layer.kv_cache = tuple(c.clone() for c in caches)
    with set_forward_context(meta), torch.no_grad():
        got = compiled(*qkv)
    torch.testing.assert_close(got, want[0])
    assert torch.equal(layer.kv_cache[0], want[1])


def test_op_outside_a_forward_context_derives_host_lengths():
    layer, meta, (q, k, v), caches = _step(4, 2, 32, [5, 0], [1, 3], torch.float32)
    want = _run(layer, meta, (q, k, v), caches, "forward_native")
    kc, vc = (c.clone() for c in caches)
    got = paged_attention(q, k, v, kc, vc, meta.query_start_loc, meta.seq_lens, meta.block_tables,
                          meta.slot_mapping, 4, 2, 32, 32 ** -0.5)
    torch.testing.assert_close(got, want[0])
    assert torch.equal(kc, want[1])


# ---- two-pass prefill (cuDNN on CUDA: own keys causal, cached context unmasked, merged by lse) ------

from kernels_reference.ops.attention import fast as fast_module  # noqa: E402
from kernels_reference.ops.attention import sdpa_prefill as sdpa_prefill_module  # noqa: E402
from kernels_reference.ops.attention import two_pass_prefill as two_pass_module  # noqa: E402
from kernels_reference.ops.attention.merge_partials import merge_partials  # noqa: E402

# fresh prompts of different lengths, a chunk continuing 37 cached tokens, decode rows among them
MIXED_STEP = ([0, 40, 0, 37, 5], [9, 1, 4, 6, 1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_merge_partials_equals_attention_over_all_keys(dtype):
    gen = _gen(11)
    q = torch.randn(5, 6, 48, generator=gen).to(DEVICE, dtype)  # head size not a power of two
    k, v = (torch.randn(23, 2, 48, generator=gen).to(DEVICE, dtype) for _ in "kv")
    full = two_pass_module.MATH_PARTIALS.full
    want, _ = full(q, k, v, 0.3)
    out_a, lse_a = full(q, k[:9], v[:9], 0.3)
    out_b, lse_b = full(q, k[9:], v[9:], 0.3)
    out_b = out_b.transpose(0, 1).contiguous().transpose(0, 1)  # strided, as the dense cuDNN output
    got = merge_partials(out_a, lse_a, out_b, lse_b, out_a)  # in place over the first partial
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


def test_merge_partials_rejects_mismatched_shapes():
    out = torch.zeros(3, 2, 16, device=DEVICE)
    with pytest.raises(ValueError, match="lse_b must be float32"):
        merge_partials(out, torch.zeros(3, 2, device=DEVICE), out, torch.zeros(2, 3, device=DEVICE), out)


def _two_pass_on_cpu(monkeypatch, partials):
    """The fast path takes the two-pass prefill on this device with ``partials`` for every step (the
    choice of steps is tested on its own); returns the list
    each call of prefill_two_pass is recorded in (so a test knows the path ran)."""
    calls = []
    real = fast_module.prefill_two_pass

    def spy(*args, **kwargs):
        calls.append(kwargs.get("skip_single_rows"))
        return real(*args, **kwargs)

    monkeypatch.setattr(fast_module, "two_pass_applies", lambda query_lens, seq_lens: True)  # every step
    monkeypatch.setattr(fast_module, "TWO_PASS_DEVICES", (torch.device(DEVICE).type,))
    monkeypatch.setattr(fast_module, "TWO_PASS_PARTIALS", partials)
    monkeypatch.setattr(fast_module, "prefill_two_pass", spy)
    monkeypatch.setattr(fast_module, "_TWO_PASS_REFUSED", set())
    return calls


@pytest.mark.parametrize("heads", [(8, 2), (4, 4), (7, 1)], ids=["gqa4", "mha", "gqa7"])
@pytest.mark.parametrize("step", ["mixed", "continuing-only", "fresh-only"])
def test_two_pass_prefill_matches_native(step, heads, monkeypatch):
    context, query = {"mixed": MIXED_STEP, "continuing-only": ([37, 70], [6, 19]),
                      "fresh-only": ([0, 0, 0], [9, 4, 13])}[step]
    calls = _two_pass_on_cpu(monkeypatch, two_pass_module.MATH_PARTIALS)
    _check_fast_path(*heads, 32, context, query, torch.bfloat16, seed=5)
    assert calls == [1 in query], "the two-pass prefill did not run (or ran more than once)"


def test_two_pass_prefill_takes_only_steps_with_a_long_continuing_chunk(monkeypatch):
    """By default the two passes take a step in which one sequence continues its cached context by
    two_pass_min_chunk query tokens or more: of the attention task's captured mixed batches the
    B118 ones (a 4352-token chunk over 2176 cached, 1.4x faster on an H100) and not B33 (its one
    continuing chunk is 92 tokens; 0.96x), nor fresh prompts without context (0.98x)."""
    from tasks.L1.test_attention import TASK
    mixed = {c.id.split("-")[-4]: c for c in TASK.cases("full") if "-mixed-" in c.id and "llama" in c.id}
    lengths = {name: (c["query"], [q + ctx for q, ctx in zip(c["query"], c["context"])]) for name, c in mixed.items()}
    assert fast_module.two_pass_applies(*lengths["B118"]) and not fast_module.two_pass_applies(*lengths["B33"])
    assert not fast_module.two_pass_applies([4096, 2048], [4096, 2048])  # fresh prompts only
    monkeypatch.setattr(fast_module, "TWO_PASS_DEVICES", (torch.device(DEVICE).type,))
    monkeypatch.setattr(fast_module, "TWO_PASS_PARTIALS", two_pass_module.MATH_PARTIALS)
    layer, meta, qkv, caches = _step(8, 2, 32, *MIXED_STEP, torch.bfloat16)  # its chunks: 6 tokens at most
    assert fast_module._two_pass(*(x.reshape(x.shape[0], -1, 32) for x in qkv), caches, meta, 32 ** -0.5, True) is None
    monkeypatch.setattr(sdpa_prefill_module, "PREFILL_CONFIG",
                        dataclasses.replace(sdpa_prefill_module.PREFILL_CONFIG, two_pass_min_chunk=6))
    assert fast_module._two_pass(*(x.reshape(x.shape[0], -1, 32) for x in qkv), caches, meta, 32 ** -0.5, True) is not None
    monkeypatch.setattr(sdpa_prefill_module, "PREFILL_CONFIG",
                        dataclasses.replace(sdpa_prefill_module.PREFILL_CONFIG, two_pass=False))
    assert fast_module._two_pass(*(x.reshape(x.shape[0], -1, 32) for x in qkv), caches, meta, 32 ** -0.5, True) is None


def test_two_pass_prefill_without_cache_attends_to_own_rows(monkeypatch):
    calls = _two_pass_on_cpu(monkeypatch, two_pass_module.MATH_PARTIALS)
    _check_fast_path(4, 2, 32, [0, 0], [9, 1], torch.bfloat16, with_cache=False)
    assert calls == [False]


class _LseInLog2(two_pass_module.MathPartials):
    """A context pass whose log-sum-exp is in base 2 (as some kernels keep it): the merge weighs
    the two passes wrongly."""

    def full(self, q, k, v, scale):
        out, lse = super().full(q, k, v, scale)
        return out, lse * 1.4426950408889634


def test_two_pass_prefill_with_a_wrong_lse_base_fails_the_check(monkeypatch):
    _two_pass_on_cpu(monkeypatch, _LseInLog2())
    with pytest.raises(AssertionError):
        _check_fast_path(8, 2, 32, MIXED_STEP[0], MIXED_STEP[1], torch.bfloat16, seed=5)


class _Refusing(two_pass_module.MathPartials):
    def causal_ragged(self, *args, **kwargs):
        raise RuntimeError("cuDNN: no engine for these heads")


def test_refused_two_pass_falls_back_to_sdpa_and_is_remembered(monkeypatch):
    calls = _two_pass_on_cpu(monkeypatch, _Refusing())
    with pytest.warns(UserWarning, match="two-pass prefill refused"):
        _check_fast_path(8, 2, 32, MIXED_STEP[0], MIXED_STEP[1], torch.bfloat16)
    _check_fast_path(8, 2, 32, MIXED_STEP[0], MIXED_STEP[1], torch.bfloat16, seed=1)
    assert len(calls) == 1  # the second step did not try again


def _fake_cudnn_attention(qh, kh, vh, scale, causal):
    """The dense cuDNN op's contract in float32 math on any device ([B, heads, L, d] in, output and
    a [B, heads, L, 1] log-sum-exp out), refusing grouped-query heads as an old cuDNN would."""
    if kh.shape[1] != qh.shape[1]:
        raise RuntimeError("cuDNN: query and key heads differ")
    outs = [two_pass_module._math_partial(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), scale, causal)
            for q, k, v in zip(qh, kh, vh)]
    return (torch.stack([o.transpose(0, 1) for o, _ in outs]),
            torch.stack([lse.t() for _, lse in outs]).unsqueeze(-1))


def test_varlen_lse_rows_from_either_layout():
    lengths = (3, 1, 4)
    cu = torch.tensor([0, 3, 4, 8], dtype=torch.int32)
    rows = torch.randn(8, 2)  # [tokens, heads]
    padded = torch.full((3, 2, 4), float("nan"))
    for b, (a, n) in enumerate(zip(cu[:-1].tolist(), lengths)):
        padded[b, :, :n] = rows[a:a + n].t()
    assert torch.equal(two_pass_module.rows_of_varlen_lse(rows.t(), cu, 8, 2, 4), rows)
    assert torch.equal(two_pass_module.rows_of_varlen_lse(padded, cu, 8, 2, 4), rows)
    with pytest.raises(RuntimeError, match="varlen log-sum-exp of shape"):
        two_pass_module.rows_of_varlen_lse(torch.zeros(8, 2), cu, 8, 2, 4)


def test_equal_length_runs():
    assert list(two_pass_module._equal_length_runs([4, 4, 1, 1, 1, 9])) == [(0, 8, 2), (8, 11, 3), (11, 20, 1)]
    skip = [False, False, True, True, False, False]
    assert list(two_pass_module._equal_length_runs([4, 4, 1, 1, 1, 9], skip)) == [(0, 8, 2), (10, 11, 1), (11, 20, 1)]


def test_cudnn_partials_layouts_on_the_ops_contract(monkeypatch):
    """CudnnPartials' views, batching of equal lengths and reshapes of the log-sum-exp, on a stand-in
    for the cuDNN op with its contract; the GQA refusal makes it repeat K/V (and remember)."""
    monkeypatch.setattr(two_pass_module, "cudnn_attention", _fake_cudnn_attention)
    partials = two_pass_module.CudnnPartials()
    gen = _gen(2)
    lengths = (5, 5, 1, 12)
    q = torch.randn(sum(lengths), 6, 16, generator=gen)
    k, v = (torch.randn(sum(lengths), 2, 16, generator=gen) for _ in "kv")
    cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
    math = two_pass_module.MATH_PARTIALS
    for got, want in ((partials.causal_ragged(q, k, v, cu, lengths, 0.25), math.causal_ragged(q, k, v, cu, lengths, 0.25)),
                      (partials.full(q[:5], k[5:], v[5:], 0.25), math.full(q[:5], k[5:], v[5:], 0.25))):
        torch.testing.assert_close(got[0], want[0])
        torch.testing.assert_close(got[1], want[1])
    assert partials.gqa_native is False


@pytest.mark.skipif(not torch.cuda.is_available(), reason="cuDNN's and FlashAttention's ops need CUDA")
@pytest.mark.parametrize("kind", ["cudnn", "flash-varlen"])
@pytest.mark.parametrize("heads", [(32, 8), (28, 4), (8, 8)], ids=["llama", "qwen2.5", "mha"])
def test_gpu_partials_match_math(heads, kind):
    nq, nk = heads
    gen = torch.Generator(device="cuda").manual_seed(0)
    lengths = (300, 1, 77, 77, 1024)
    t = sum(lengths)
    q = torch.randn(t, nq, 128, generator=gen, device="cuda").bfloat16()
    k, v = (torch.randn(t, nk, 128, generator=gen, device="cuda").bfloat16() for _ in "kv")
    cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device="cuda")
    gpu = {"cudnn": two_pass_module.CudnnPartials(), "flash-varlen": two_pass_module.FlashVarlenPartials()}[kind]
    math = two_pass_module.MATH_PARTIALS
    for got, want in ((gpu.causal_ragged(q, k, v, cu, lengths, 0.088), math.causal_ragged(q, k, v, cu, lengths, 0.088)),
                      (gpu.full(q[:77], k[77:500], v[77:500], 0.088), math.full(q[:77], k[77:500], v[77:500], 0.088))):
        torch.testing.assert_close(got[1], want[1], rtol=0, atol=2e-2)  # the lse: natural log, [L, H]
        torch.testing.assert_close(got[0].float(), want[0].float(), rtol=0, atol=3e-2)


def test_two_pass_prefill_on_the_cudnn_class_matches_native(monkeypatch):
    monkeypatch.setattr(two_pass_module, "cudnn_attention", _fake_cudnn_attention)
    calls = _two_pass_on_cpu(monkeypatch, two_pass_module.CudnnPartials())
    _check_fast_path(8, 2, 32, [0, 40, 0, 0, 37, 5], [4, 1, 4, 9, 6, 1], torch.bfloat16, seed=8)
    assert calls == [True]
