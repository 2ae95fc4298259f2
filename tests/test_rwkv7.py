"""RWKV-7's time mix (ChunkRWKV7): the definition pinned on a hand-computed step, the reference's
Triton kernel (interpreted) against the float64 recurrence at small shapes, and the task's verdicts
on honest and wrong candidates over its CPU cases."""
import importlib

import pytest
import torch

from fk_pytest import Case, status
from fk_pytest.registry import _suite_package, get_task
from kernels_reference.L1.rwkv7 import ChunkRWKV7

from conftest import CANDIDATES, EXAMPLES, ROOT
from test_verdicts import assert_fails_exactly, assert_passes_every_case, load, verdicts

pytest.importorskip("triton")
rwkv7_inputs = importlib.import_module(_suite_package().__name__ + ".rwkv7_inputs").rwkv7_inputs

TASK = "rwkv7"
# below, on and across a 16-token sub-chunk and the 64-token chunk, in one varlen batch
CHUNK_EDGES = (1, 17, 65)


def _inputs(lengths, dtype, with_state, heads=2, k_dim=32, v_dim=48, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return rwkv7_inputs(lengths, heads, k_dim, v_dim, with_state, gen, "cpu", dtype, decay_rank=8, a_rank=8)


def _truth(inputs):
    wide = {n: (x.double() if torch.is_tensor(x) and x.is_floating_point() else x) for n, x in inputs.items()}
    return ChunkRWKV7().forward_native(**wide)


def _rel(x, truth):
    return float((x.double() - truth).norm() / truth.norm())


def test_one_step_is_the_dplr_update_read_after_the_write():
    """The definition on one token, written out: the correction reads the state *before* the
    decay (FLA's DPLR recurrence), and the output reads the state after the token's write."""
    gen = torch.Generator().manual_seed(5)
    kd, vd = 4, 3
    r, w, k, a, b = (torch.randn(1, 1, 1, kd, generator=gen, dtype=torch.float64) for _ in range(5))
    w = -w.abs()
    v = torch.randn(1, 1, 1, vd, generator=gen, dtype=torch.float64)
    s0 = torch.randn(1, 1, kd, vd, generator=gen, dtype=torch.float64)
    o, s1 = ChunkRWKV7().forward_native(r, w, k, v, a, b, scale=0.5, initial_state=s0, output_final_state=True)
    flat = lambda x: x.reshape(-1)  # noqa: E731
    expected = (torch.diag(flat(w).exp()) @ s0[0, 0] + torch.outer(flat(b), flat(a) @ s0[0, 0])
                + torch.outer(flat(k), flat(v)))
    assert torch.allclose(s1[0, 0], expected)
    assert torch.allclose(o.reshape(-1), expected.T @ (flat(r) * 0.5))


def test_scale_defaults_to_chunk_rwkv7s_and_none_means_inverse_sqrt_k():
    inputs = _inputs((5,), torch.float32, True)
    del inputs["scale"]
    o_default, _ = ChunkRWKV7().forward_native(**inputs)
    o_one, _ = ChunkRWKV7().forward_native(**inputs, scale=1.0)
    o_none, _ = ChunkRWKV7().forward_native(**inputs, scale=None)
    o_root, _ = ChunkRWKV7().forward_native(**inputs, scale=32 ** -0.5)
    assert torch.equal(o_default, o_one) and torch.equal(o_none, o_root) and not torch.equal(o_one, o_none)


@pytest.mark.parametrize("lengths, with_state", [(CHUNK_EDGES, False), (CHUNK_EDGES, True), ((1, 1, 1), True)],
                         ids=["varlen-fresh", "varlen-carried", "decode"])
def test_triton_kernel_matches_the_recurrence_in_float32(monkeypatch, lengths, with_state):
    """float32 operands: the recurrent kernel is the recurrence over varlen sequences, fresh and
    carried, and in decode (V = 48 is no power of two: the tiles' masked columns are exercised).
    The interpreter costs per token and program: one head for prefill, two (head offsets) in decode.
    (Prefill runs chunked by default: here the recurrent kernel takes it, as with PREFILL_CHUNKED off.)"""
    from kernels_reference.ops.rwkv7 import chunk

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(chunk, "PREFILL_CHUNKED", False)
    inputs = _inputs(lengths, torch.float32, with_state, heads=2 if max(lengths) == 1 else 1)
    o, state = ChunkRWKV7().forward_triton(**inputs)
    truth_o, truth_state = _truth(inputs)
    assert o.shape == truth_o.shape and o.dtype == torch.float32 and state.dtype == torch.float32
    assert _rel(o, truth_o) < 1e-5 and _rel(state, truth_state) < 1e-5


def test_gpu_tiling_matches_the_recurrence(monkeypatch):
    """The interpreter runs whole heads per program; the GPU's tiles (32-wide V blocks) split
    V = 80 into three masked blocks, and K = 96 is a masked 128-wide key block. Run those tiles
    interpreted, prefill included (the recurrent kernel's, as with PREFILL_CHUNKED off)."""
    from kernels_reference.ops.rwkv7 import chunk

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("FK_GPU_TILES", "1")
    monkeypatch.setattr(chunk, "PREFILL_CHUNKED", False)
    inputs = _inputs((1, 20), torch.float32, True, heads=1, k_dim=96, v_dim=80, seed=4)
    o, state = ChunkRWKV7().forward_triton(**inputs)
    truth_o, truth_state = _truth(inputs)
    assert _rel(o, truth_o) < 1e-5 and _rel(state, truth_state) < 1e-5


def test_bf16_stays_near_the_recurrence(monkeypatch):
    """The recurrent kernel with bf16 inputs and output (the interpreter truncates the stores): a
    few tenths of a percent on o, float32-exact on the state, where a lost state or term would be
    O(1). (The chunked prefill's bf16 products are checked below.)"""
    from kernels_reference.ops.rwkv7 import chunk

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(chunk, "PREFILL_CHUNKED", False)
    inputs = _inputs((30,), torch.bfloat16, True, heads=1, seed=1)
    o, state = ChunkRWKV7().forward_triton(**inputs)
    truth_o, truth_state = _truth(inputs)
    assert o.dtype == torch.bfloat16
    assert _rel(o, truth_o) < 0.01 and _rel(state, truth_state) < 1e-5


# The chunked prefill kernels (16-token chunks): lengths below, on and across chunks in one batch,
# with and without carried states; the GPU's tiles (16-wide key blocks of the prep kernel's cubes,
# 16-wide V slices of the walk) run interpreted too, on key and value widths that are no powers of 2.
@pytest.mark.parametrize("lengths, with_state, dims, gpu_tiles", [
    (CHUNK_EDGES, False, (32, 48), False),
    ((16, 33, 15), True, (32, 48), False),
    ((1, 20, 33), True, (96, 80), True),
], ids=["varlen-fresh", "varlen-carried", "carried-gpu-tiles-k96-v80"])
def test_chunked_prefill_matches_the_recurrence_in_float32(monkeypatch, lengths, with_state, dims, gpu_tiles):
    from kernels_reference.ops.rwkv7 import chunk

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if gpu_tiles:
        monkeypatch.setenv("FK_GPU_TILES", "1")
    monkeypatch.setattr(chunk, "PREFILL_CHUNKED", True)
    inputs = _inputs(lengths, torch.float32, with_state, heads=1, k_dim=dims[0], v_dim=dims[1], seed=3)
    o, state = ChunkRWKV7().forward_triton(**inputs)
    truth_o, truth_state = _truth(inputs)
    assert _rel(o, truth_o) < 1e-5 and _rel(state, truth_state) < 1e-5


@pytest.mark.parametrize("gpu_tiles", [False, True], ids=["whole", "gpu-tiles"])
def test_chunked_walk_with_its_loads_a_chunk_ahead_matches_the_recurrence(monkeypatch, gpu_tiles):
    """The walk's prefetching form (WALK_PREFETCH, the default since it was timed on an H100): each
    next chunk's tiles loaded a step ahead, the last chunk of a sequence reading nothing past it."""
    from kernels_reference.ops.rwkv7 import chunk

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if gpu_tiles:
        monkeypatch.setenv("FK_GPU_TILES", "1")
    monkeypatch.setattr(chunk, "PREFILL_CHUNKED", True)
    monkeypatch.setattr(chunk, "WALK_PREFETCH", True)
    inputs = _inputs((1, 20, 33, 16), torch.float32, True, heads=1, k_dim=96 if gpu_tiles else 32,
                     v_dim=80 if gpu_tiles else 48, seed=7)
    o, state = ChunkRWKV7().forward_triton(**inputs)
    truth_o, truth_state = _truth(inputs)
    assert _rel(o, truth_o) < 1e-5 and _rel(state, truth_state) < 1e-5


def test_chunked_prefill_takes_any_decay_and_bf16_stays_near():
    """Every exponent of the chunked form is a difference c_t - c_s <= 0, so decays far stronger than
    the layer's (w down to about -18 per token) neither overflow nor lose the state; bf16 operands
    (truncated by the interpreter) stay within about a percent."""
    from kernels_reference.ops.rwkv7 import chunk

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITON_INTERPRET", "1")
        patch.setattr(chunk, "PREFILL_CHUNKED", True)
        strong = _inputs((50,), torch.float32, True, heads=1, seed=2)
        strong["w"] = strong["w"] * 30
        o, state = ChunkRWKV7().forward_triton(**strong)
        truth_o, truth_state = _truth(strong)
        assert _rel(o, truth_o) < 1e-5 and _rel(state, truth_state) < 1e-5
        half = _inputs(CHUNK_EDGES, torch.bfloat16, True, heads=1, seed=1)
        o, state = ChunkRWKV7().forward_triton(**half)
        truth_o, truth_state = _truth(half)
        assert o.dtype == torch.bfloat16 and _rel(o, truth_o) < 0.02 and _rel(state, truth_state) < 0.02


def test_chunked_prefill_inverts_a_strong_in_chunk_correction(monkeypatch):
    """Repeated keys (one direction, as a repeated token gives): T[t, s] ~ a_t . b_s is about 0.9 for
    every pair, so (I - T)^{-1} needs every power of T up to T^15; random keys (|T| ~ 1/8) would not
    notice a truncated inverse."""
    from kernels_reference.ops.rwkv7 import chunk

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(chunk, "PREFILL_CHUNKED", True)
    inputs = _inputs((40, 16), torch.float32, True, heads=1, seed=5)
    gen = torch.Generator().manual_seed(6)
    shape = inputs["a"].shape
    kk = torch.nn.functional.normalize(torch.randn(shape[-1], generator=gen) + 0.05 * torch.randn(shape, generator=gen),
                                       dim=-1)
    inputs["a"], inputs["b"] = -kk, 0.9 * kk
    o, state = ChunkRWKV7().forward_triton(**inputs)
    truth_o, truth_state = _truth(inputs)
    assert _rel(o, truth_o) < 1e-5 and _rel(state, truth_state) < 1e-5


def test_unpacked_batch_equals_the_packed_one():
    """Without cu_seqlens the B rows are B sequences (FLA's equal-length form)."""
    packed = _inputs((5, 5), torch.float32, True)
    rows = {n: (x.reshape(2, 5, *x.shape[2:]) if n in ("r", "w", "k", "v", "a", "b") else x)
            for n, x in packed.items() if n != "cu_seqlens"}
    o_rows, s_rows = ChunkRWKV7().forward_native(**rows)
    o_packed, s_packed = ChunkRWKV7().forward_native(**packed)
    assert torch.equal(o_rows.reshape(o_packed.shape), o_packed) and torch.equal(s_rows, s_packed)


def test_the_custom_op_is_the_module_and_maps_no_state_to_none():
    """``fk::chunk_rwkv7`` (what torch.compile sees) returns the module's outputs, and an empty
    state when none is asked for (an op cannot return None)."""
    inputs = _inputs((3, 2), torch.float32, True)
    args = [inputs[n] for n in ("r", "w", "k", "v", "a", "b", "scale", "initial_state")]
    o, state = torch.ops.fk.chunk_rwkv7(*args, True, inputs["cu_seqlens"])
    o_ref, state_ref = ChunkRWKV7().forward_native(**inputs)
    assert torch.equal(o, o_ref) and torch.equal(state, state_ref)
    _, none = torch.ops.fk.chunk_rwkv7(*args, False, inputs["cu_seqlens"])
    assert none.numel() == 0


# ---- verdicts through the real machinery -----------------------------------------------------------
@pytest.mark.parametrize("tree", [EXAMPLES, ROOT / "kernels_reference"], ids=["examples", "reference-tree"])
def test_honest_candidates_pass(tree):
    assert_passes_every_case(TASK, tree)


def _prefill(case):
    return max(case["lengths"]) > 1


@pytest.mark.parametrize("tree, failing", [
    ("rwkv7_drops_initial_state", lambda case: case["with_state"]),
    ("rwkv7_state_reset_per_chunk", lambda case: max(case["lengths"]) > 64),
    ("rwkv7_decode_reads_before_write", lambda case: max(case["lengths"]) == 1),
    ("rwkv7_a_b_swapped", lambda case: True),
])
def test_wrong_candidates_fail_exactly_where_their_bug_shows(tree, failing):
    """Each bug is WRONG_RESULT on every case that exercises it (carried states; sequences longer
    than a chunk; decode steps; any correction at all) and passes every case that does not."""
    assert_fails_exactly(TASK, tree, failing)


def test_correction_after_the_decay_fails_every_prefill():
    """The correction reading the decayed state differs by b a^T (1 - D) S per token: it compounds
    over a prefill (8-10x the bar here); one decode step moves o by only ~3x the bar, so decode
    cases are not asserted either way."""
    cases = get_task(TASK).cases("cpu")
    counts, results = verdicts(TASK, load(CANDIDATES / "rwkv7_removal_after_decay", TASK), cases)
    failed = {r.case_id for r in results if not r.passed}
    assert {c.id for c in cases if _prefill(c)} <= failed, counts
    assert {r.status for r in results if not r.passed} == {status.WRONG_RESULT}


def test_chunk_reset_passes_when_no_sequence_crosses_a_chunk():
    """The state-reset bug is invisible unless a sequence crosses a chunk boundary, and only the
    cases' boundary-crossing lengths expose it."""
    real = get_task(TASK).cases("cpu")[0]
    within = Case("within-one-chunk", real.dtype, params=dict(real.params, lengths=(1, 63, 64), with_state=True))
    counts, _ = verdicts(TASK, load(CANDIDATES / "rwkv7_state_reset_per_chunk", TASK), [within])
    assert counts == {status.PASSED: 1}
