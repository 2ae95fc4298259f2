"""ShortConvolution: the reference's Triton kernels (interpreted) against its native definition, and
the task's verdicts on an honest and three wrong candidates (each wrong in one phase only)."""
from collections import Counter

import pytest
import torch

from fk_pytest import status
from fk_pytest.candidates import CandidateSource
from fk_pytest.correctness import evaluate_case
from fk_pytest.registry import get_task

from conftest import CANDIDATES, EXAMPLES

triton = pytest.importorskip("triton")


def _module(dim, kernel, bias, dtype):
    from kernels_reference.L1.short_convolution import ShortConvolution

    gen = torch.Generator().manual_seed(dim + kernel)
    module = ShortConvolution(dim, kernel, bias=bias)
    with torch.no_grad():
        module.weight.copy_(0.5 * torch.randn(module.weight.shape, generator=gen))
        if bias:
            module.bias.copy_(torch.randn(dim, generator=gen))
    return module.to(dtype)


# Packed lengths whose sequences start and end on both sides of the prefill kernel's token tiles
# (64 on a GPU, 128 interpreted), several sequences in one tile, an empty sequence, and sequences
# shorter than K - 1 (their new state keeps part of the old one).
LENGTHS = [(1, 63, 64, 65, 0, 2, 130), (200,), (3, 1, 2)]


def _prefill_both_ways(lengths, kernel, bias, dtype, dim=160):
    module = _module(dim, kernel, bias, dtype)
    gen = torch.Generator().manual_seed(len(lengths))
    qsl = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(lengths), 0)
    wide = torch.randn(int(qsl[-1]), dim + 24, generator=gen).to(dtype)
    x = wide[:, 16: 16 + dim]  # a column slice, as Mamba-2's (x, B, C) is of in_proj's output
    pool = torch.randn(len(lengths) + 4, kernel - 1, dim, generator=gen).to(dtype)
    slots = torch.randperm(pool.shape[0], generator=gen)[:len(lengths)].to(torch.int32)
    initial = torch.tensor([i % 3 != 1 for i in range(len(lengths))])  # with and without a state
    got_pool, want_pool = pool.clone(), pool.clone()
    got = module.forward_triton(x, got_pool, qsl, slots, initial)
    want = module.forward_native(x, want_pool, qsl, slots, initial)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    assert torch.equal(got_pool, want_pool)  # states are copies of inputs: exact
    untouched = torch.ones(pool.shape[0], dtype=torch.bool)
    untouched[slots.long()] = False
    assert torch.equal(got_pool[untouched], pool[untouched])


@pytest.mark.parametrize("lengths", LENGTHS, ids=lambda ls: "-".join(map(str, ls)))
@pytest.mark.parametrize("kernel, bias, dtype", [(4, True, torch.float32), (4, False, torch.bfloat16),
                                                 (3, True, torch.float32), (2, False, torch.float32)])
def test_triton_prefill_matches_native(monkeypatch, lengths, kernel, bias, dtype):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    _prefill_both_ways(lengths, kernel, bias, dtype)  # 160 channels: a masked channel block


def test_triton_prefill_with_gpu_tiles_matches_native(monkeypatch):
    """The GPU's tiles (64 tokens x 128 channels): more token tiles, two channel blocks."""
    from kernels_reference.ops.short_conv import kernels

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(kernels, "_tiles", lambda _: (64, 128, 4))
    _prefill_both_ways(LENGTHS[0], 4, True, torch.float32)


@pytest.mark.parametrize("kernel, bias", [(4, True), (3, False)])
def test_triton_decode_matches_native_over_steps(monkeypatch, kernel, bias):
    """Several decode steps in a row: each reads the state the previous one shifted."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    dim, batch = 96, 3
    module = _module(dim, kernel, bias, torch.float32)
    gen = torch.Generator().manual_seed(7)
    pool = torch.randn(batch + 2, kernel - 1, dim, generator=gen)
    slots = torch.tensor([3, 0, 4], dtype=torch.int32)
    got_pool, want_pool = pool.clone(), pool.clone()
    for _ in range(kernel + 1):
        x = torch.randn(batch, dim, generator=gen)
        got = module.forward_triton(x, got_pool, cache_indices=slots)
        want = module.forward_native(x, want_pool, cache_indices=slots)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert torch.equal(got_pool, want_pool)
    assert torch.equal(got_pool[[1, 2]], pool[[1, 2]])


def _verdicts(tree):
    task = get_task("short_convolution")
    cls = CandidateSource(tree).load_class(task)
    return {case.id: evaluate_case(task, case, 1234, cls, "cpu") for case in task.cases("cpu")}


def test_example_candidate_passes_every_case():
    results = _verdicts(EXAMPLES)
    assert all(r.passed for r in results.values()), {k: r.message for k, r in results.items() if not r.passed}


@pytest.mark.parametrize("tree, fails_on, output", [
    ("conv_no_initial_state", lambda cid: "-cont-" in cid, "out"),
    ("conv_leaks_across_sequences", lambda cid: "-varlen-" in cid, "out"),
    ("conv_decode_stale_state", lambda cid: "-decode-" in cid, "conv_states"),
])
def test_wrong_candidate_fails_exactly_where_its_bug_shows(tree, fails_on, output):
    results = _verdicts(CANDIDATES / tree)
    failed = {cid for cid, r in results.items() if not r.passed}
    assert failed == {cid for cid in results if fails_on(cid)}, sorted(failed)
    assert Counter(results[cid].status for cid in failed) == {status.WRONG_RESULT: len(failed)}
    assert all(output in results[cid].message for cid in failed), [results[c].message for c in failed][:2]


def _per_sequence(x, weight, bias, pool, qsl, slots, initial):
    """The definition sequence by sequence, as the module's docstring states it (float64)."""
    width = weight.shape[-1]
    out = torch.empty_like(x)
    for s, slot in enumerate(slots.tolist()):
        start, end = int(qsl[s]), int(qsl[s + 1])
        before = pool[slot] if initial[s] else torch.zeros(width - 1, x.shape[1], dtype=x.dtype)
        window = torch.cat([before, x[start:end]])
        for t in range(end - start):
            acc = bias + (window[t: t + width] * weight.T).sum(0)
            out[start + t] = torch.nn.functional.silu(acc)
        pool[slot] = window[end - start:]
    return out


def test_native_definition_is_the_per_sequence_window_and_never_reads_the_device_on_the_host():
    """The vectorised definition against the plain per-sequence one: empty and shorter-than-K - 1
    sequences, slots out of order, fresh sequences whose slots hold NaN; and, under the host-sync
    check, nothing that would stop a CUDA-graph capture."""
    from fk_pytest.host_sync import HostSyncCheck
    from kernels_reference.ops.short_conv.native import short_conv_native

    gen = torch.Generator().manual_seed(3)
    lengths, dim, width = [5, 0, 2, 1, 9, 3], 12, 4
    qsl = torch.tensor([0] + torch.cumsum(torch.tensor(lengths), 0).tolist(), dtype=torch.int32)
    x = torch.randn(sum(lengths), dim, generator=gen, dtype=torch.float64)
    weight = torch.randn(dim, width, generator=gen, dtype=torch.float64)
    bias = torch.randn(dim, generator=gen, dtype=torch.float64)
    pool = torch.randn(9, width - 1, dim, generator=gen, dtype=torch.float64)
    slots = torch.tensor([7, 2, 0, 5, 8, 3], dtype=torch.int32)
    initial = torch.tensor([True, False, False, True, False, True])
    pool[slots[~initial].long()] = float("nan")  # a fresh sequence must not read its slot
    want_pool, got_pool = pool.clone(), pool.clone()
    want = _per_sequence(x, weight, bias, want_pool, qsl, slots, initial)
    with HostSyncCheck():
        got = short_conv_native(x, weight, bias, got_pool, qsl, slots, initial, "silu")
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got_pool, want_pool, rtol=0, atol=0, equal_nan=True)
