"""Mamba-2's decoder layer and model: their fast paths (the children's Triton kernels, interpreted)
against their native paths over steps through the state pools, and the tasks' verdicts on honest
and wrong candidates over their CPU cases."""
import os

import pytest
import torch


from conftest import EXAMPLES, ROOT
from test_hf_mamba2 import LENGTHS, SLOTS, STEPS, VOCAB, _hf_model, _our_model, run_model_steps
from test_verdicts import assert_fails_exactly, assert_passes_every_case

os.environ.setdefault("TRITON_INTERPRET", "1")  # the kernels run interpreted on the CPU
pytest.importorskip("triton")


def test_model_fast_path_matches_its_native_path():
    """With every child on its Triton path, the two-layer model in float32 gives the logits and
    the per-layer pools of its native path over prefill, mixed and decode steps."""
    from fk_pytest.build import with_paths

    gen = torch.Generator().manual_seed(3)
    ours = _our_model(_hf_model(gen))
    ids = {s: torch.randint(0, VOCAB, (n,), generator=gen) for s, n in LENGTHS.items()}
    pools = ours.allocate_state_pools(5)
    for conv, ssm in pools:
        conv.normal_(generator=gen)
        ssm.normal_(generator=gen)
    fast = with_paths(ours, "forward_triton")
    fast_pools = [tuple(p.clone() for p in pair) for pair in pools]
    for mixer, pair in zip(fast.mixers(), fast_pools):  # the twin is a copy: bind it its own pools
        mixer.state_cache = pair
    expected = run_model_steps(ours, ids, STEPS, SLOTS)
    got = run_model_steps(fast, ids, STEPS, SLOTS, method="forward")
    for s in LENGTHS:
        torch.testing.assert_close(got[s], expected[s], rtol=1e-4, atol=1e-4)
    for pair, native in zip(fast_pools, pools):
        for p, q in zip(pair, native):
            torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-4)


# ---- verdicts through the real machinery -----------------------------------------------------------
@pytest.mark.parametrize("task", ["mamba2_decoder_layer", "mamba2_for_causal_lm"])
@pytest.mark.parametrize("tree", [EXAMPLES, ROOT / "kernels_reference"], ids=["examples", "reference-tree"])
def test_honest_candidates_pass(task, tree):
    assert_passes_every_case(task, tree)


@pytest.mark.parametrize("tree, task, failing", [
    ("mamba2_layer_norm_before_add", "mamba2_decoder_layer", lambda case: True),
    ("mamba2_layer_stateless", "mamba2_decoder_layer", lambda case: any(c > 0 for c in case["context"])),
    ("mamba2_lm_final_norm_no_residual", "mamba2_for_causal_lm", lambda case: True),
    ("mamba2_lm_one_pool_pair", "mamba2_for_causal_lm", lambda case: True),
])
def test_wrong_candidates_fail_where_their_bug_shows(tree, task, failing):
    """The mixer fed the norm of its input alone and a final norm without the residual fail every case; a layer that
    clears its slots fails the steps with a continuing sequence (every CPU step has one); layers
    sharing one pool pair fail every step (their states overwrite each other)."""
    assert_fails_exactly(task, tree, failing)
