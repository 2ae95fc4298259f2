"""GLA's layer (flash-linear-attention's GatedLinearAttention): the reference against a float64
re-implementation written from FLA's layer semantics (transformers has no GLA model to compare
with), its fast path (the children's Triton kernels, interpreted) against its float64 native path
over a mixed step, and the task's verdicts on honest and wrong candidates over its CPU cases."""
import pytest
import torch
import torch.nn.functional as F

from kernels_reference.forward_context import AttentionMetadata, set_forward_context
from kernels_reference.L2.gla_layer import GatedLinearAttention

from conftest import EXAMPLES
from test_verdicts import assert_fails_exactly, assert_passes_every_case

TASK = "gated_linear_attention_layer"
HIDDEN, HEADS, EPS = 64, 2, 1e-6  # expand_k 0.5, expand_v 1: 16 x 32 heads
# (context, new tokens, slot) per sequence: two decodes, a fresh prompt across the 64-token chunk,
# a continued one; slots 1 and 4 of the 6-slot pool belong to no sequence.
STEP = ((5, 1, 3), (12, 1, 0), (0, 66, 2), (30, 7, 5))


def _layer_and_step(gen, dtype=torch.float64):
    layer = GatedLinearAttention(hidden_size=HIDDEN, num_heads=HEADS, norm_eps=EPS).requires_grad_(False)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (p.shape[-1] ** -0.5 if p.dim() > 1 else 0.3))
        layer.init_random_parameters(gen)
        layer.g_norm_swish_gate.weight.add_(1.0)
    context, new, slots = zip(*STEP)
    meta = AttentionMetadata.build(list(context), list(new), 16, state_slots=list(slots))
    x = torch.randn(sum(new), HIDDEN, generator=gen)
    pool = torch.randn(6, HEADS, 16, 32, generator=gen)
    return layer.to(dtype), meta, x.to(dtype), pool.to(dtype)


def fla_semantics(sd, x, pool, step, heads, eps, normalizer=16.0):
    """FLA's GatedLinearAttention (GLA-1.3B's settings) in float64, one sequence and token at a
    time: q, k, v, g from their projections, gk = logsigmoid(gk_proj(x)) / normalizer, per head
    S <- diag(exp(gk_t)) S + k_t v_t^T and o_t = S^T q_t / sqrt(K) (S from the slot when the
    sequence continues, else zeros; written back after its last token), then per head row
    rmsnorm(o) * weight * swish(g), and o_proj."""
    w = {n: t.double() for n, t in sd.items()}
    x = x.double()
    q, k, v, g = (x @ w[f"{n}_proj.weight"].T for n in "qkvg")
    gk = F.logsigmoid((x @ w["gk_proj.0.weight"].T) @ w["gk_proj.1.weight"].T + w["gk_proj.1.bias"]) / normalizer
    t = x.shape[0]
    q, k, gk = (a.view(t, heads, -1) for a in (q, k, gk))
    v, g = v.view(t, heads, -1), g.view(t, heads, -1)
    o, start = torch.empty_like(v), 0
    for context, new, slot in step:
        s = pool[slot].clone() if context else torch.zeros_like(pool[slot])
        for i in range(start, start + new):
            s = torch.exp(gk[i])[:, :, None] * s + k[i][:, :, None] * v[i][:, None, :]
            o[i] = torch.einsum("hkv,hk->hv", s, q[i]) * q.shape[-1] ** -0.5
        pool[slot] = s
        start += new
    normed = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps) * w["g_norm_swish_gate.weight"]
    return (normed * F.silu(g)).reshape(t, -1) @ w["o_proj.weight"].T


def test_parameters_carry_flas_checkpoint_names():
    layer = GatedLinearAttention(hidden_size=HIDDEN, num_heads=HEADS)
    shapes = {n: tuple(p.shape) for n, p in layer.state_dict().items()}
    assert shapes == {"q_proj.weight": (32, 64), "k_proj.weight": (32, 64), "v_proj.weight": (64, 64),
                      "g_proj.weight": (64, 64), "gk_proj.0.weight": (16, 64), "gk_proj.1.weight": (32, 16),
                      "gk_proj.1.bias": (32,), "g_norm_swish_gate.weight": (32,), "o_proj.weight": (64, 64)}


def test_native_layer_is_flas_layer_semantics_in_float64():
    """Output and pool equal the token-by-token re-implementation over a mixed step (decodes first,
    a fresh prompt whose slot holds garbage, a continued prompt); spare slots come back unchanged."""
    layer, meta, x, pool = _layer_and_step(torch.Generator().manual_seed(0))
    got_pool, want_pool = pool.clone(), pool.clone()
    layer.state_cache = (got_pool,)
    with set_forward_context(meta):
        out = layer.forward_native(x)
    want = fla_semantics(layer.state_dict(), x, want_pool, STEP, HEADS, EPS)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(got_pool, want_pool, rtol=1e-10, atol=1e-10)
    assert torch.equal(got_pool[[1, 4]], pool[[1, 4]]) and not torch.equal(got_pool, pool)


def test_fast_path_matches_the_float64_native_layer(monkeypatch):
    """With the core and the gated norm on their Triton kernels (as on a GPU, interpreted here),
    the layer in float32 equals its float64 definition: output and pool. Decodes go to the
    recurrent kernel, the prefills to the chunked one, one norm over all rows."""
    pytest.importorskip("triton")
    from kernels_reference.L1 import gla, rms_norm_gated
    from kernels_reference.ops.gla import chunk, recurrent

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    used = []
    for module, name in ((chunk, "chunk_forward"), (recurrent, "recurrent_forward")):
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _f=original, _n=name, **kw: used.append(_n) or _f(*a, **kw))
    for module, cls in ((gla, "ChunkGLA"), (rms_norm_gated, "RMSNormGated")):
        monkeypatch.setattr(module, "use_fast_path", lambda *tensors: True)
        original = getattr(module, cls).forward_triton
        monkeypatch.setattr(getattr(module, cls), "forward_triton",
                            lambda self, *a, _f=original, _n=cls, **kw: used.append(_n) or _f(self, *a, **kw))
    truth_layer, meta, x, pool = _layer_and_step(torch.Generator().manual_seed(1))
    layer = GatedLinearAttention(hidden_size=HIDDEN, num_heads=HEADS, norm_eps=EPS).requires_grad_(False)
    layer.load_state_dict(truth_layer.state_dict())
    got_pool, want_pool = pool.float(), pool.clone()
    layer.state_cache, truth_layer.state_cache = (got_pool,), (want_pool,)
    with set_forward_context(meta):
        out = layer(x.float())
        want = truth_layer.forward_native(x)
    assert sorted(used) == sorted(["ChunkGLA", "recurrent_forward", "ChunkGLA", "chunk_forward", "RMSNormGated"])
    for got, truth in ((out, want), (got_pool, want_pool)):
        assert float((got.double() - truth).norm() / truth.norm()) < 1e-5


def test_a_fresh_one_token_prompt_is_a_prefill_not_a_decode():
    """A 1-token prompt has no state to continue: its slot's leftovers must not reach its output."""
    layer, _, x, pool = _layer_and_step(torch.Generator().manual_seed(2))
    meta = AttentionMetadata.build([0], [1], 16, state_slots=[3])
    outs = []
    for scale in (1.0, 100.0):  # change only the garbage in the slot
        layer.state_cache = (pool * scale,)
        with set_forward_context(meta):
            outs.append(layer.forward_native(x[:1]))
    assert torch.equal(outs[0], outs[1])


# ---- verdicts through the real machinery -----------------------------------------------------------
def test_honest_example_passes():
    assert_passes_every_case(TASK, EXAMPLES)


def _decode_only(case):
    return all(q == 1 for q in case["query"])


@pytest.mark.parametrize("tree, failing", [
    ("gla_layer_gate_before_norm", lambda case: True),
    ("gla_layer_no_normalizer", lambda case: True),
    ("gla_layer_reads_fresh_slots", lambda case: 0 in case["context"]),
    ("gla_layer_decode_batch_slots", _decode_only),
], ids=["gate-before-norm", "no-normalizer", "reads-fresh-slots", "decode-batch-slots"])
def test_wrong_candidates_fail_exactly_where_their_bug_shows(tree, failing):
    """Gating before the norm and a decay without its normaliser fail every case; ignoring
    has_initial_state fails the steps with a fresh sequence; addressing the pool by batch position
    on decode-only steps fails those steps only."""
    assert_fails_exactly(TASK, tree, failing)
