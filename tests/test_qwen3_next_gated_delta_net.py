"""Qwen3-Next's gated DeltaNet block: its fast path (the children's Triton kernels, interpreted)
against its float64 native path over a mixed step, and the task's verdicts on honest and wrong
candidates over its CPU cases."""
import pytest
import torch

from kernels_reference.forward_context import AttentionMetadata, set_forward_context
from kernels_reference.L2.qwen3_next_gated_delta_net import Qwen3NextGatedDeltaNet

from conftest import EXAMPLES, ROOT
from test_verdicts import assert_fails_exactly, assert_passes_every_case

pytest.importorskip("triton")

TASK = "qwen3_next_gated_delta_net"


def _block_and_step(gen):
    block = Qwen3NextGatedDeltaNet(64, 2, 4, 32, 16, 4, 1e-6).requires_grad_(False)
    with torch.no_grad():
        for name, p in block.named_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (p.shape[-1] ** -0.5 if p.dim() > 1 else 0.3))
        block.A_log.copy_(torch.linspace(0.02, 4.0, 4).log())
    # decodes first, then a fresh prefill across the 64-token chunk and a continuing one
    meta = AttentionMetadata.build([5, 12, 0, 30], [1, 1, 66, 7], 16, state_slots=[4, 0, 2, 5])
    x = torch.randn(75, 64, generator=gen)
    conv = torch.randn(6, 3, 2 * 64 + 64, generator=gen)
    ssm = 0.1 * torch.randn(6, 4, 32, 16, generator=gen)
    return block, meta, x, conv, ssm


def test_fast_path_matches_the_float64_native_block(monkeypatch):
    """With every child on its Triton kernel (as on a GPU), the block in float32 equals its float64
    definition: output and both pools (the spare slots untouched)."""
    from kernels_reference.L1 import gated_delta_rule, rms_norm_gated, short_convolution
    from kernels_reference.L2 import qwen3_next_gated_delta_net as block_module

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    used = []
    monkeypatch.setattr(block_module, "use_fast_path", lambda *tensors: True)
    monkeypatch.setattr(block_module, "gdn_gating",
                        lambda *a, _f=block_module.gdn_gating: used.append("gdn_gating") or _f(*a))
    for module, cls in ((gated_delta_rule, "GatedDeltaRule"), (rms_norm_gated, "RMSNormGated"),
                        (short_convolution, "ShortConvolution")):
        monkeypatch.setattr(module, "use_fast_path", lambda *tensors: True)
        original = getattr(module, cls).forward_triton
        monkeypatch.setattr(getattr(module, cls), "forward_triton",
                            lambda self, *a, _f=original, _n=cls, **kw: used.append(_n) or _f(self, *a, **kw))
    block, meta, x, conv, ssm = _block_and_step(torch.Generator().manual_seed(0))
    pools = (conv.clone(), ssm.clone())
    block.state_cache = pools
    with set_forward_context(meta):
        out = block(x)
    # decode and prefill phases each run the conv and the delta rule; one norm over all rows
    assert sorted(used) == sorted(["ShortConvolution", "GatedDeltaRule"] * 2 + ["RMSNormGated", "gdn_gating"])
    truth_block = Qwen3NextGatedDeltaNet(64, 2, 4, 32, 16, 4, 1e-6).double().requires_grad_(False)
    truth_block.load_state_dict(block.state_dict())
    truth_pools = (conv.double(), ssm.double())
    truth_block.state_cache = truth_pools
    with set_forward_context(meta):
        truth = truth_block.forward_native(x.double())
    for got, want in zip((out,) + pools, (truth,) + truth_pools):
        assert float((got.double() - want).norm() / want.norm()) < 1e-5
    for spare in (1, 3):
        assert torch.equal(pools[0][spare], conv[spare]) and torch.equal(pools[1][spare], ssm[spare])


@pytest.mark.parametrize("k_heads, v_heads", [(2, 4), (3, 3), (2, 6)], ids=["shared-by-2", "one-each", "shared-by-3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gating_kernel_reads_the_grouped_ba_layout(monkeypatch, k_heads, v_heads, dtype):
    """g (float32) and beta from the fused [b | a]-per-key-head projection equal the block's native
    gates on the same rows, including a + dt_bias past softplus' linear threshold and far below 0."""
    from kernels_reference.ops.gated_delta.gating import gdn_gating

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    gen = torch.Generator().manual_seed(2)
    block = Qwen3NextGatedDeltaNet(32, k_heads, v_heads, 16, 16).requires_grad_(False)
    block.A_log.copy_(torch.linspace(0.01, 16.0, v_heads).log())
    block.dt_bias.copy_(torch.randn(v_heads, generator=gen))
    ba = (4 * torch.randn(37, 2 * v_heads, generator=gen)).to(dtype)
    ba[0], ba[1] = 30.0, -30.0
    g, beta = gdn_gating(ba, block.A_log, block.dt_bias, k_heads)
    want_g, want_beta = block.gates(ba.double(), native=True)
    assert g.dtype == torch.float32 and beta.dtype == dtype
    torch.testing.assert_close(g.double(), want_g, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(beta.double(), want_beta, rtol=1e-2 if dtype == torch.bfloat16 else 1e-6, atol=0)


def test_a_fresh_one_token_prompt_is_a_prefill_not_a_decode():
    """A 1-token prompt has no state to continue: its slot's leftovers must not reach its output."""
    block, _, x, conv, ssm = _block_and_step(torch.Generator().manual_seed(1))
    meta = AttentionMetadata.build([0], [1], 16, state_slots=[3])
    outs = []
    for scale in (1.0, 100.0):  # change only the garbage in the slot
        block.state_cache = (conv * scale, ssm * scale)
        with set_forward_context(meta):
            outs.append(block.forward_native(x[:1]))
    assert torch.equal(outs[0], outs[1])


# ---- verdicts through the real machinery -----------------------------------------------------------
@pytest.mark.parametrize("tree", [EXAMPLES, ROOT / "kernels_reference"], ids=["examples", "reference-tree"])
def test_honest_candidates_pass(tree):
    assert_passes_every_case(TASK, tree)


@pytest.mark.parametrize("tree, failing", [
    ("gdn_qkvz_flat_split", lambda case: True),
    ("gdn_reads_fresh_slots", lambda case: 0 in case["context"]),
    ("gdn_decode_state_not_stored", lambda case: 1 in case["query"] and "prefill" not in case.id),
    ("gdn_mixed_prefill_first", lambda case: "mixed" in case.id),
])
def test_wrong_candidates_fail_exactly_where_their_bug_shows(tree, failing):
    """The grouped-layout bug fails every case; ignoring has_initial_state fails the steps with a
    fresh sequence; a decode step's lost state the steps with decodes; the prefill-first output
    order only the mixed step."""
    assert_fails_exactly(TASK, tree, failing)
