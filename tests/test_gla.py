"""Gated linear attention (ChunkGLA): the reference's Triton paths (interpreted) against the float64
recurrence at small head dims, and the task's verdicts on honest and wrong candidates over its CPU
cases."""
import importlib

import pytest
import torch

from fk_pytest import Case, status
from fk_pytest.registry import _suite_package, get_task
from kernels_reference.L1.gla import ChunkGLA

from conftest import CANDIDATES, EXAMPLES, ROOT
from test_verdicts import assert_fails_exactly, assert_passes_every_case, load, verdicts

pytest.importorskip("triton")
gla_inputs = importlib.import_module(_suite_package().__name__ + ".gla_inputs").gla_inputs

TASK = "gated_linear_attention"
# below, on and across the 64-token chunk (and its 16-token sub-chunks), and two chunk boundaries
CHUNK_EDGES = (1, 17, 63, 64, 65, 130)


def _inputs(lengths, dtype, with_state, heads=2, k_dim=32, v_dim=48, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return gla_inputs(lengths, heads, k_dim, v_dim, with_state, gen, "cpu", dtype)


def _truth(inputs):
    wide = {n: (x.double() if torch.is_tensor(x) and x.is_floating_point() else x) for n, x in inputs.items()}
    return ChunkGLA().forward_native(**wide)


def _rel(x, truth):
    return float((x.double() - truth).norm() / truth.norm())


@pytest.mark.parametrize("lengths", [CHUNK_EDGES, (1, 1, 1)], ids=["chunked", "decode"])
@pytest.mark.parametrize("with_state", [False, True], ids=["fresh", "carried"])
def test_triton_paths_match_the_recurrence_in_float32(monkeypatch, lengths, with_state):
    """float32 operands: the sub-chunked form and the recurrent kernel are the recurrence (V = 48
    is no power of two: the tiles' masked columns are exercised too)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    inputs = _inputs(lengths, torch.float32, with_state)
    o, state = ChunkGLA().forward_triton(**inputs)
    truth_o, truth_state = _truth(inputs)
    assert o.shape == truth_o.shape and o.dtype == torch.float32 and state.dtype == torch.float32
    assert _rel(o, truth_o) < 1e-5 and _rel(state, truth_state) < 1e-5


@pytest.mark.parametrize("lengths", [(70, 1, 64), (1, 1)], ids=["chunked", "decode"])
def test_gpu_tiling_matches_the_recurrence(monkeypatch, lengths):
    """The interpreter runs whole heads per program; the GPU's tiles (the state walk's 32 x 64
    blocks, 64-wide K and V blocks of the output, 32-wide K steps of the scores, 32-wide V blocks
    in decode) split K = 96 and V = 80 into several masked blocks. Run those tiles interpreted."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("FK_GPU_TILES", "1")
    inputs = _inputs(lengths, torch.float32, True, k_dim=96, v_dim=80, seed=4)
    o, state = ChunkGLA().forward_triton(**inputs)
    truth_o, truth_state = _truth(inputs)
    assert _rel(o, truth_o) < 1e-5 and _rel(state, truth_state) < 1e-5


@pytest.mark.parametrize("gpu_tiles", [False, True], ids=["whole", "gpu-tiles"])
def test_state_walk_with_its_loads_a_chunk_ahead_matches_the_recurrence(monkeypatch, gpu_tiles):
    """The state walk's prefetching form (STATE_PREFETCH, off until timed on a GPU): each next
    chunk's tiles loaded a step ahead, the last chunk of a sequence reading nothing past it; an empty
    sequence among them."""
    from kernels_reference.ops.gla import chunk

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if gpu_tiles:
        monkeypatch.setenv("FK_GPU_TILES", "1")
    monkeypatch.setattr(chunk, "STATE_PREFETCH", True)
    inputs = _inputs((70, 0, 1, 64, 129), torch.float32, True, k_dim=96 if gpu_tiles else 32,
                     v_dim=80 if gpu_tiles else 48, seed=8)
    o, state = ChunkGLA().forward_triton(**inputs)
    truth_o, truth_state = _truth(inputs)
    assert _rel(o, truth_o) < 1e-5 and _rel(state, truth_state) < 1e-5


def test_chunked_bf16_stays_near_the_recurrence(monkeypatch):
    """bf16 tensor-core operands (the interpreter truncates them, more than the GPU's rounding):
    about a percent, where a lost state or chunk would be O(1)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    inputs = _inputs(CHUNK_EDGES, torch.bfloat16, True, seed=1)
    o, state = ChunkGLA().forward_triton(**inputs)
    truth_o, truth_state = _truth(inputs)
    assert o.dtype == torch.bfloat16
    assert _rel(o, truth_o) < 0.03 and _rel(state, truth_state) < 0.03


def test_fast_decays_do_not_overflow_the_chunked_form(monkeypatch):
    """Channels forgetting ~20 nats per token: across a 64-token chunk exp(-b) is far beyond
    float32, so splitting exp(b_t - b_s) into e^{b_t} e^{-b_s} per chunk would give inf/nan. The
    sub-chunk factorisation keeps both factors <= 1."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    inputs = _inputs((130, 70), torch.float32, True, k_dim=40, v_dim=24, seed=2)
    gen = torch.Generator().manual_seed(3)
    inputs["g"] = torch.nn.functional.logsigmoid(4 * torch.randn(inputs["g"].shape, generator=gen) - 6)
    assert inputs["g"].min() < -15
    o, state = ChunkGLA().forward_triton(**inputs)
    truth_o, truth_state = _truth(inputs)
    assert torch.isfinite(o).all() and torch.isfinite(state).all()
    assert _rel(o, truth_o) < 1e-5 and _rel(state, truth_state) < 1e-5


def test_decode_goes_to_the_recurrent_kernel_and_prefill_to_the_chunked_one(monkeypatch):
    from kernels_reference.ops.gla import chunk, recurrent

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    used = []
    for module, name in ((chunk, "chunk_forward"), (recurrent, "recurrent_forward")):
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _f=original, _n=name, **kw: used.append(_n) or _f(*a, **kw))
    ChunkGLA().forward_triton(**_inputs((1, 1), torch.float32, True))
    ChunkGLA().forward_triton(**_inputs((2, 1), torch.float32, True))
    assert used == ["recurrent_forward", "chunk_forward"]


def test_unpacked_batch_equals_the_packed_one():
    """Without cu_seqlens the B rows are B sequences (FLA's equal-length form)."""
    packed = _inputs((5, 5), torch.float32, True)
    rows = {n: (x.reshape(2, 5, *x.shape[2:]) if n in ("q", "k", "v", "g") else x)
            for n, x in packed.items() if n != "cu_seqlens"}
    o_rows, s_rows = ChunkGLA().forward_native(**rows)
    o_packed, s_packed = ChunkGLA().forward_native(**packed)
    assert torch.equal(o_rows.reshape(o_packed.shape), o_packed) and torch.equal(s_rows, s_packed)


# ---- verdicts through the real machinery -----------------------------------------------------------
@pytest.mark.parametrize("tree", [EXAMPLES, ROOT / "kernels_reference"], ids=["examples", "reference-tree"])
def test_honest_candidates_pass(tree):
    assert_passes_every_case(TASK, tree)


@pytest.mark.parametrize("tree, failing", [
    ("gla_drops_initial_state", lambda case: case["with_state"]),
    ("gla_state_reset_per_chunk", lambda case: max(case["lengths"]) > 64),
    ("gla_decode_reads_before_write", lambda case: max(case["lengths"]) == 1),
    ("gla_decay_per_head", lambda case: True),
])
def test_wrong_candidates_fail_exactly_where_their_bug_shows(tree, failing):
    """Each bug is WRONG_RESULT on every case that exercises it (carried states; sequences longer
    than a chunk; decode steps; any decay at all) and passes every case that does not."""
    assert_fails_exactly(TASK, tree, failing)


def test_chunk_reset_passes_when_no_sequence_crosses_a_chunk():
    """The state-reset bug is invisible unless a sequence crosses a chunk boundary, and only the
    cases' boundary-crossing lengths expose it."""
    real = get_task(TASK).cases("cpu")[0]
    within = Case("within-one-chunk", real.dtype, params=dict(real.params, lengths=(1, 63, 64), with_state=True))
    counts, _ = verdicts(TASK, load(CANDIDATES / "gla_state_reset_per_chunk", TASK), [within])
    assert counts == {status.PASSED: 1}
