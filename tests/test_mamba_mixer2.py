"""Mamba-2's mixer: its fast path (the children's Triton kernels, interpreted) against its native
path over prefill, mixed and decode steps, and the task's verdicts on honest and wrong candidates
over its CPU cases."""
import os

import pytest
import torch


from conftest import EXAMPLES, ROOT
from test_hf_mamba2 import LENGTHS, SLOTS, STEPS, TINY, _hf_mixer, _our_mixer, garbage_pools, run_steps
from test_verdicts import assert_fails_exactly, assert_passes_every_case

os.environ.setdefault("TRITON_INTERPRET", "1")  # the kernels run interpreted on the CPU
pytest.importorskip("triton")

TASK = "mamba_mixer2"


def test_fast_path_matches_the_native_block():
    """With every child on its Triton path, the block in float32 equals its native path over steps
    that cross the 16-token chunk from zero and from carried states: outputs and both pools."""
    from fk_pytest.build import with_paths

    gen = torch.Generator().manual_seed(1)
    ours = _our_mixer(_hf_mixer(gen))
    x = {s: torch.randn(n, TINY["hidden_size"], generator=gen) for s, n in LENGTHS.items()}
    pools = garbage_pools(ours, gen)
    native_pools = tuple(p.clone() for p in pools)
    expected = run_steps(ours, x, STEPS, SLOTS, native_pools)
    fast = with_paths(ours, "forward_triton")
    assert {type(m).__name__ for m in fast.modules() if "forward" in m.__dict__} == {
        "ShortConvolution", "MambaChunkScanCombined", "SelectiveStateUpdate", "RMSNormGated"}
    got = run_steps(fast, x, STEPS, SLOTS, pools, method="forward")
    for s in LENGTHS:
        torch.testing.assert_close(got[s], expected[s], rtol=1e-4, atol=1e-4)
    for p, q in zip(pools, native_pools):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-4)


# ---- verdicts through the real machinery -----------------------------------------------------------
@pytest.mark.parametrize("tree", [EXAMPLES, ROOT / "kernels_reference"], ids=["examples", "reference-tree"])
def test_honest_candidates_pass(tree):
    assert_passes_every_case(TASK, tree)


@pytest.mark.parametrize("tree, failing", [
    ("mixer2_gate_x_swapped", lambda case: True),
    ("mixer2_reads_fresh_slots", lambda case: 0 in case["context"]),
    ("mixer2_decode_without_dt_bias", lambda case: "prefill" not in case.id),
    ("mixer2_mixed_initial_flags_unshifted", lambda case: "mixed" in case.id),
])
def test_wrong_candidates_fail_exactly_where_their_bug_shows(tree, failing):
    """The swapped projection fails every case; ignoring has_initial_state fails the steps with a
    fresh sequence; the decode step without dt_bias the steps with decodes; prefill flags not
    shifted past the decodes only the mixed step."""
    assert_fails_exactly(TASK, tree, failing)
