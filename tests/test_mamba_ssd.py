"""Mamba-2's SSD kernels (kernels_reference/ops/mamba_ssd) and their tasks (mamba_chunk_scan,
selective_state_update).

The Triton paths run in the CPU interpreter against the float64 token-by-token recurrence, at
lengths that cross chunk boundaries, with and without initial states; the tasks' verdicts come
from the same ``evaluate_case`` the standard tests use: the example candidates pass every CPU case,
and candidates wrong in the ways scans go wrong fail exactly the cases that can see the bug.
"""
import importlib
import os
from collections import Counter

import pytest
import torch

from fk_pytest import status
from fk_pytest.candidates import CandidateSource
from fk_pytest.correctness import evaluate_case
from fk_pytest.timing import refill
from kernels_reference.ops.mamba_ssd import native
from kernels_reference.ops.chunk_table import chunk_table
from kernels_reference.ops.mamba_ssd.chunk_scan import ssd_chunk_scan
from kernels_reference.ops.mamba_ssd.state_update import selective_state_update

from conftest import CANDIDATES, EXAMPLES

os.environ.setdefault("TRITON_INTERPRET", "1")  # the kernels run interpreted on the CPU


def task_of(module):  # this checkout's task modules (an installed fk_tasks may be another tree)
    return importlib.import_module(f"tasks.L1.{module}").TASK


SCAN, UPDATE = "test_mamba_chunk_scan", "test_selective_state_update"


def _upcast(inputs):
    return {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in inputs.items()}


def _rel(x, truth):
    return float((x.double() - truth).norm() / truth.norm())


def _scan_inputs(lengths, heads, groups, dstate, dtype, with_state, gated=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    t, p = sum(lengths), 64
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    inputs = dict(x=torch.randn(t, heads, p, generator=g).to(dtype), dt=torch.randn(t, heads, generator=g).to(dtype),
                  A=-(1 + 15 * torch.rand(heads, generator=g)), B=torch.randn(t, groups, dstate, generator=g).to(dtype),
                  C=torch.randn(t, groups, dstate, generator=g).to(dtype), cu_seqlens=cu,
                  D=(1 + 0.2 * torch.randn(heads, generator=g)).to(dtype),
                  dt_bias=torch.log(torch.expm1(torch.rand(heads, generator=g) * 0.1 + 1e-3)).to(dtype))
    inputs["z"] = torch.randn(t, heads, p, generator=g).to(dtype) if gated else None
    inputs["initial_states"] = 0.1 * torch.randn(len(lengths), heads, p, dstate, generator=g) if with_state else None
    return inputs


# chunk 64 keeps the interpreter quick; the lengths sit on both sides of its boundaries
@pytest.mark.parametrize("lengths, groups, dstate, dtype, with_state, gated", [
    ((200,), 1, 32, torch.bfloat16, False, False),
    ((1, 63, 64, 65, 130), 2, 32, torch.bfloat16, True, False),
    ((7, 129), 1, 160, torch.float32, True, True),  # a state wider than one tile, not a power of 2
], ids=["one-zero-bf16", "varlen-state-bf16-groups2", "gated-state-n160-fp32"])
def test_triton_chunk_scan_matches_the_recurrence(lengths, groups, dstate, dtype, with_state, gated):
    inputs = _scan_inputs(lengths, 4, groups, dstate, dtype, with_state, gated)
    y_true, s_true = native.ssd_scan(**_upcast(inputs))
    y, states = ssd_chunk_scan(**inputs, chunk_size=64)
    assert y.dtype == dtype and states.dtype == torch.float32 and states.shape == s_true.shape
    # bf16 GEMM operands (production's numerics) and the interpreter's truncating casts: a few
    # bf16 ulps; float32 operands: float32 rounding over a few hundred steps
    bound = 1.5e-2 if dtype == torch.bfloat16 else 2e-5
    assert _rel(y, y_true) < bound and _rel(states, s_true) < bound
    if with_state:  # the bound is tight enough to see an initial state left out
        assert _rel(native.ssd_scan(**_upcast({**inputs, "initial_states": None}))[1], s_true) > 10 * bound


@pytest.mark.parametrize("heads_first, output_tiles", [(True, None), (False, (128, 32, 4, 3))],
                         ids=["heads-first", "chunks-first-128-rows"])
def test_gpu_tiling_matches_the_recurrence(monkeypatch, heads_first, output_tiles):
    """The interpreter runs whole chunks per program; the GPU's tiles split a 128-token chunk into
    2 x 2 C.B tiles (the one above the diagonal zero-filled: 128-row output blocks read it), output
    row blocks stepping over 32 tokens, and the state pass into 512-element blocks. Run those tiles
    interpreted, in both grid orders, on lengths across the chunk and with more than one group."""
    from kernels_reference.ops.mamba_ssd import chunk_scan

    monkeypatch.setenv("FK_GPU_TILES", "1")
    monkeypatch.setattr(chunk_scan, "HEADS_FIRST", heads_first)
    if output_tiles:
        monkeypatch.setattr(chunk_scan, "OUTPUT_TILES", output_tiles)
    inputs = _scan_inputs((1, 127, 129, 40), 4, 2, 32, torch.float32, True, gated=True, seed=5)
    y_true, s_true = native.ssd_scan(**_upcast(inputs))
    y, states = ssd_chunk_scan(**inputs, chunk_size=128)
    assert _rel(y, y_true) < 2e-5 and _rel(states, s_true) < 2e-5


def test_what_the_work_tables_hold_past_a_chunk_never_reaches_the_output(monkeypatch):
    """The scan's work buffers come from torch.empty and may hold anything, NaN included, where no
    kernel writes them: past a chunk's tokens, and C . B wholly above the diagonal, which the output
    kernel reads unmasked from its padded table. Filled with NaN, the outputs and states are still the
    recurrence's on the GPU's tiles (a kernel that multiplies what lies there by zero, where it should select
    it away, fails here: NaN * 0 is NaN)."""
    inputs = _scan_inputs((1, 127, 129, 40), 4, 2, 32, torch.float32, True, gated=True, seed=7)
    y_true, s_true = native.ssd_scan(**_upcast(inputs))
    monkeypatch.setenv("FK_GPU_TILES", "1")
    empty = torch.empty

    def nan_empty(*args, **kwargs):
        t = empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", nan_empty)
    y, states = ssd_chunk_scan(**inputs, chunk_size=128)
    assert _rel(y, y_true) < 2e-5 and _rel(states, s_true) < 2e-5


def test_chunk_table_cuts_each_sequence_from_its_own_start():
    cu = torch.tensor([0, 0, 5, 305, 306], dtype=torch.int32)  # an empty sequence, then 5, 300, 1
    bound, seq, start, length, first, count = chunk_table(cu, 306, 128)
    used = length > 0
    assert seq[used].tolist() == [1, 2, 2, 2, 3]
    assert start[used].tolist() == [0, 5, 133, 261, 305] and length[used].tolist() == [5, 128, 128, 44, 1]
    assert count.tolist() == [0, 1, 3, 1] and first.tolist() == [0, 0, 1, 4] and bound >= 5


@pytest.mark.parametrize("sequences, chunk", [(1, 256), (7, 16), (300, 8)])
def test_chunk_table_agrees_with_a_walk_over_the_sequences(sequences, chunk):
    """Random lengths (zeros among them), many chunks per program and more sequences than one
    program's block of chunk ids: every chunk's (sequence, start, length) and each sequence's
    (first chunk, count) as a plain loop over the sequences gives them; the tail of the upper
    bound has length 0."""
    gen = torch.Generator().manual_seed(sequences)
    lengths = torch.randint(0, 3 * chunk, (sequences,), generator=gen)
    lengths[:: 5] = 0
    cu = torch.zeros(sequences + 1, dtype=torch.int64)
    cu[1:] = torch.cumsum(lengths, 0)
    bound, seq, start, length, first, count = chunk_table(cu, int(cu[-1]), chunk)
    want, firsts, counts = [], [], []
    for i, n in enumerate(lengths.tolist()):
        firsts.append(len(want))
        counts.append(-(-n // chunk))
        want += [(i, int(cu[i]) + j, min(chunk, n - j)) for j in range(0, n, chunk)]
    assert bound >= len(want)
    got = list(zip(seq.tolist(), start.tolist(), length.tolist()))
    assert got[:len(want)] == want and all(n == 0 for n in length[len(want):].tolist())
    assert first.tolist() == firsts and count.tolist() == counts


def test_an_empty_sequence_keeps_its_initial_state():
    inputs = _scan_inputs((0, 20), 2, 1, 16, torch.float32, True)
    y, states = ssd_chunk_scan(**inputs, chunk_size=16)
    assert torch.equal(states[0], inputs["initial_states"][0])
    assert _rel(states[1], native.ssd_scan(**_upcast(inputs))[1][1]) < 2e-5


@pytest.mark.parametrize("pool_dtype, tied, gated", [(torch.float32, True, False), (torch.bfloat16, False, True),
                                                     (torch.float32, "per-head", False)])
def test_triton_state_update_matches_the_step(pool_dtype, tied, gated):
    """``tied``: dt broadcast over head_dim; "per-head": dt_bias too (vLLM's stride-0 views), the
    kernel's one-value-per-head path, which must give the elementwise path's bits."""
    g = torch.Generator().manual_seed(3)
    b, h, p, n, groups, pool = 3, 4, 64, 32, 2, 7
    dt = torch.randn(b, h, 1 if tied else p, generator=g).expand(b, h, p)
    bias = torch.full((h, 1), -4.0).expand(h, p) if tied == "per-head" else torch.full((h, p), -4.0)
    inputs = dict(x=torch.randn(b, h, p, generator=g).bfloat16(), dt=dt.bfloat16(),
                  A=-(1 + 15 * torch.rand(h, 1, 1, generator=g)).expand(h, p, n),
                  B=torch.randn(b, groups, n, generator=g).bfloat16(), C=torch.randn(b, groups, n, generator=g).bfloat16(),
                  D=torch.rand(h, p, generator=g), dt_bias=bias,
                  z=torch.randn(b, h, p, generator=g).bfloat16() if gated else None, dt_softplus=True,
                  state_batch_indices=torch.tensor([5, 0, 3], dtype=torch.int32))
    state = (0.1 * torch.randn(pool, h, p, n, generator=g)).to(pool_dtype)
    truth_state = state.double()
    y_true = native.state_update(truth_state, **_upcast(inputs))
    mine = state.clone()
    y = selective_state_update(mine, **inputs)
    assert _rel(y, y_true) < 1e-2 and _rel(mine, truth_state) < (1e-5 if pool_dtype == torch.float32 else 1e-2)
    assert torch.equal(mine[[1, 2, 4, 6]], state[[1, 2, 4, 6]])  # slots outside the batch untouched
    if tied == "per-head":  # the same values passed with full strides take the elementwise path
        full = {k: (v.contiguous() if k in ("dt", "A", "dt_bias") else v) for k, v in inputs.items()}
        elementwise = state.clone()
        assert torch.equal(selective_state_update(elementwise, **full), y) and torch.equal(elementwise, mine)


def test_refill_writes_a_broadcast_view_through_its_memory():
    """The timing's refill of an input set (fk_pytest.timing.refill) and a stride-0 input."""
    buffer = torch.zeros(4).view(4, 1).expand(4, 3)
    value = torch.arange(4.0).view(4, 1).expand(4, 3)
    refill(buffer, value)
    assert torch.equal(buffer, value) and buffer.stride() == (1, 0)
    with pytest.raises(ValueError, match="another layout"):
        refill(buffer, torch.ones(4, 3))


# ---- verdicts ---------------------------------------------------------------------------------------
SEED = 1234


def verdicts(module, tree):
    task = task_of(module)
    cls = CandidateSource(tree).load_class(task)
    return {case.id: evaluate_case(task, case, SEED, cls, "cpu") for case in task.cases("cpu")}


def slots_out_of_order(case_id):
    """Whether the case's draw puts the batch in other slots than 0..B-1 (as evaluate_case draws)."""
    task = task_of(UPDATE)
    case = next(c for c in task.cases("cpu") if c.id == case_id)
    slots = task.make_inputs(case, torch.Generator().manual_seed(SEED), "cpu")["state_batch_indices"]
    return slots.tolist() != list(range(case["batch"]))


@pytest.mark.parametrize("module", [SCAN, UPDATE])
def test_example_candidates_pass_every_case(module):
    results = verdicts(module, EXAMPLES)
    assert Counter(r.status for r in results.values()) == {status.PASSED: len(results)}, \
        [r.message for r in results.values() if not r.passed][:3]


@pytest.mark.parametrize("tree, module, failing", [
    # blind where no sequence carries a state
    ("ssd_no_initial_state", SCAN, lambda c: c.endswith("-state-bf16")),
    # blind where no sequence is longer than a chunk: none in the CPU cases
    ("ssd_chunks_restart", SCAN, lambda c: True),
    # blind in a batch of one sequence
    ("ssd_leaks_across_sequences", SCAN, lambda c: "-varlen-" in c),
    ("ssu_no_dt_bias", UPDATE, lambda c: True),
    ("ssu_no_softplus", UPDATE, lambda c: True),
    # blind only where the batch's slots happen to be 0..B-1 in order
    ("ssu_slots_in_batch_order", UPDATE, slots_out_of_order),
])
def test_wrong_candidates_fail_the_cases_that_see_their_bug(tree, module, failing):
    results = verdicts(module, CANDIDATES / tree)
    expected = {cid for cid in results if failing(cid)}
    assert expected, "no CPU case can see this bug"
    assert {cid for cid, r in results.items() if not r.passed} == expected
    assert {r.status for cid, r in results.items() if cid in expected} <= {status.WRONG_RESULT,
                                                                           status.NONFINITE_OUTPUT}
