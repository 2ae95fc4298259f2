"""The gated delta rule: the reference's Triton paths (interpreted) against the float64 recurrence
at small head dims, and the task's verdicts on honest and wrong candidates over its CPU cases."""
import importlib

import pytest
import torch

from fk_pytest import Case, status
from fk_pytest.registry import _suite_package, get_task
from kernels_reference.L1.gated_delta_rule import GatedDeltaRule

from conftest import CANDIDATES, EXAMPLES, ROOT
from test_verdicts import assert_fails_exactly, assert_passes_every_case, load, verdicts

pytest.importorskip("triton")
gated_delta_inputs = importlib.import_module(_suite_package().__name__ + ".gated_delta_inputs").gated_delta_inputs

TASK = "gated_delta_rule"
CHUNK_EDGES = (1, 63, 64, 65, 130)  # below, on and across the 64-token chunk, and two boundaries


def _inputs(lengths, dtype, with_state, k_heads=1, v_heads=2, dim=32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return gated_delta_inputs(lengths, k_heads, v_heads, dim, dim, with_state, gen, "cpu", dtype)


def _truth(inputs):
    wide = {n: (x.double() if torch.is_tensor(x) and x.is_floating_point() else x) for n, x in inputs.items()}
    return GatedDeltaRule().forward_native(**wide)


def _rel(x, truth):
    return float((x.double() - truth).norm() / truth.norm())


@pytest.mark.parametrize("lengths", [CHUNK_EDGES, (1, 1, 1)], ids=["chunked", "decode"])
@pytest.mark.parametrize("with_state", [False, True], ids=["fresh", "carried"])
def test_triton_paths_match_the_recurrence_in_float32(monkeypatch, lengths, with_state):
    """float32 operands: the chunked UT-transform form and the recurrent kernel are the recurrence."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    inputs = _inputs(lengths, torch.float32, with_state)
    o, state = GatedDeltaRule().forward_triton(**inputs)
    truth_o, truth_state = _truth(inputs)
    assert o.shape == truth_o.shape and o.dtype == torch.float32 and state.dtype == torch.float32
    assert _rel(o, truth_o) < 1e-5 and _rel(state, truth_state) < 1e-5


def test_state_pass_with_its_loads_a_chunk_ahead_matches_the_recurrence(monkeypatch):
    """The state pass's prefetching form (STATE_PREFETCH, off until timed on a GPU): each next
    chunk's tiles loaded a step ahead, the last chunk of a sequence reading nothing past it; an
    empty sequence among the others."""
    from kernels_reference.ops.gated_delta import chunk

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(chunk, "STATE_PREFETCH", True)
    inputs = _inputs(CHUNK_EDGES + (0, 130), torch.float32, True, seed=2)
    o, state = GatedDeltaRule().forward_triton(**inputs)
    truth_o, truth_state = _truth(inputs)
    assert _rel(o, truth_o) < 1e-5 and _rel(state, truth_state) < 1e-5


def test_chunked_bf16_stays_near_the_recurrence(monkeypatch):
    """bf16 tensor-core operands (the interpreter truncates them, ~5x the GPU's rounding error):
    a few percent at most, where a lost state or chunk would be O(1)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    inputs = _inputs(CHUNK_EDGES, torch.bfloat16, True, k_heads=1, v_heads=2, seed=1)  # GQA group 2
    o, state = GatedDeltaRule().forward_triton(**inputs)
    truth_o, truth_state = _truth(inputs)
    assert o.dtype == torch.bfloat16
    assert _rel(o, truth_o) < 0.03 and _rel(state, truth_state) < 0.03


def test_decode_goes_to_the_recurrent_kernel_and_prefill_to_the_chunked_one(monkeypatch):
    from kernels_reference.ops.gated_delta import chunk, recurrent

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    used = []
    for module, name in ((chunk, "chunk_forward"), (recurrent, "recurrent_forward")):
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _f=original, _n=name, **kw: used.append(_n) or _f(*a, **kw))
    GatedDeltaRule().forward_triton(**_inputs((1, 1), torch.float32, True))
    GatedDeltaRule().forward_triton(**_inputs((2, 1), torch.float32, True))
    assert used == ["recurrent_forward", "chunk_forward"]


def test_unpacked_batch_equals_the_packed_one():
    """Without cu_seqlens the B rows are B sequences (FLA's equal-length form)."""
    packed = _inputs((5, 5), torch.float32, True)
    rows = {n: (x.reshape(2, 5, *x.shape[2:]) if n in ("q", "k", "v", "g", "beta") else x)
            for n, x in packed.items() if n != "cu_seqlens"}
    o_rows, s_rows = GatedDeltaRule().forward_native(**rows)
    o_packed, s_packed = GatedDeltaRule().forward_native(**packed)
    assert torch.equal(o_rows.reshape(o_packed.shape), o_packed) and torch.equal(s_rows, s_packed)


# ---- verdicts through the real machinery -----------------------------------------------------------
@pytest.mark.parametrize("tree", [EXAMPLES, ROOT / "kernels_reference"], ids=["examples", "reference-tree"])
def test_honest_candidates_pass(tree):
    assert_passes_every_case(TASK, tree)


@pytest.mark.parametrize("tree, failing", [
    ("gdr_drops_initial_state", lambda case: case["with_state"]),
    ("gdr_state_reset_per_chunk", lambda case: max(case["lengths"]) > 64),
    ("gdr_decode_decay_after_update", lambda case: max(case["lengths"]) == 1),
])
def test_wrong_candidates_fail_exactly_where_their_bug_shows(tree, failing):
    """Each bug is WRONG_RESULT on every case that exercises it (carried states; sequences longer
    than a chunk; decode steps) and passes every case that does not."""
    assert_fails_exactly(TASK, tree, failing, some_pass=True)


def test_chunk_reset_passes_when_no_sequence_crosses_a_chunk():
    """The state-reset bug is invisible unless a sequence crosses a chunk boundary, and only the
    cases' boundary-crossing lengths expose it."""
    task = get_task(TASK)
    real = task.cases("cpu")[0]
    within = Case("within-one-chunk", real.dtype, params=dict(real.params, lengths=(1, 63, 64), with_state=True))
    counts, _ = verdicts(TASK, load(CANDIDATES / "gdr_state_reset_per_chunk", TASK), [within])
    assert counts == {status.PASSED: 1}
