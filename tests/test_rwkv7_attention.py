"""RWKV-7's time-mix layer (flash-linear-attention's RWKV7Attention, fla/layers/rwkv7.py): the
reference against a float64 token-by-token re-implementation written from FLA's layer semantics,
its fast path (the core's Triton kernel, interpreted) against its float64 native path over a mixed
step, and the task's verdicts on honest and wrong candidates over its CPU cases."""
import pytest
import torch

from kernels_reference.forward_context import AttentionMetadata, set_forward_context
from kernels_reference.L2.rwkv7_attention import RWKV7Attention

from conftest import EXAMPLES
from test_verdicts import assert_fails_exactly, assert_passes_every_case

TASK = "rwkv7_attention"
HIDDEN, HEAD, EPS = 128, 64, 1e-5  # 2 heads of 64 x 64
RANKS = dict(decay_low_rank_dim=8, a_low_rank_dim=8, v_low_rank_dim=4, gate_low_rank_dim=16)
# (context, new tokens, slot) per sequence: two decodes, a fresh prompt across the 64-token chunk,
# a continued one; slots 1 and 4 of the 6-slot pools belong to no sequence.
STEP = ((5, 1, 3), (12, 1, 0), (0, 66, 2), (30, 7, 5))
POOL = 6


def _layer(layer_idx):
    return RWKV7Attention(hidden_size=HIDDEN, head_dim=HEAD, norm_eps=EPS, layer_idx=layer_idx, fuse_norm=True,
                          num_hidden_layers=4, **RANKS).requires_grad_(False)


def _layer_and_step(gen, layer_idx=1, dtype=torch.float64):
    layer = _layer(layer_idx)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5)
            elif name.startswith("x_"):
                p.copy_(torch.rand(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5 + (1.0 if name in ("k_k", "k_a") else 0.0))
        layer.w_lora.lora[2].bias.copy_(-8 + 11 * torch.rand(HIDDEN, generator=gen))  # slow to fast decays
        layer.r_k.copy_(0.3 * torch.randn(layer.r_k.shape, generator=gen))
    context, new, slots = zip(*STEP)
    meta = AttentionMetadata.build(list(context), list(new), 16, state_slots=list(slots))
    t = sum(new)
    x, v_first = torch.randn(t, HIDDEN, generator=gen), torch.randn(t, HIDDEN, generator=gen)
    shift, states = torch.randn(POOL, HIDDEN, generator=gen), 2 * torch.randn(POOL, 2, HEAD, HEAD, generator=gen)
    return layer.to(dtype), meta, x.to(dtype), v_first.to(dtype), shift.to(dtype), states.to(dtype)


def fla_semantics(sd, x, v_first, shift, states, step, layer_idx, eps):
    """FLA's RWKV7Attention in float64, one sequence and token at a time. Per token: the previous
    hidden row (the slot's shift row for a continuing sequence's first token, zeros for a fresh
    one), delta = prev - x, the six mixes x + delta * x_*; r, k, v; w = -exp(-0.5) sigmoid(w_lora);
    v lerped toward v_first by sigmoid(v_lora) past layer 0 (layer 0: v_first = v); iclr =
    sigmoid(a_lora); g = g_lora (a sigmoid inside); kk = k * k_k / |k * k_k| per head; k = k * (1 +
    (iclr - 1) k_a); per head S <- diag(exp w) S - (kk iclr)(kk^T S) + k v^T (S from the slot or
    zeros), o = S^T r; a LayerNorm of each head's row (eps = head_dim * norm_eps) with weight and
    bias, plus (r . (k * r_k)) v, times g, o_proj. Pools get each sequence's last row and state."""
    p = {n: t.double() for n, t in sd.items()}
    x, v_first = x.double(), v_first.double() if v_first is not None else None

    def lora(name, z, act):
        low = z @ p[f"{name}.lora.0.weight"].T
        up = act(low) @ p[f"{name}.lora.2.weight"].T
        return up + p[f"{name}.lora.2.bias"] if f"{name}.lora.2.bias" in p else up

    heads = p["r_k"].shape[0]
    out, firsts, start = torch.empty_like(x), torch.empty_like(x), 0
    for context, new, slot in step:
        prev = shift[slot].clone() if context else torch.zeros(x.shape[1], dtype=x.dtype)
        s = states[slot].clone() if context else torch.zeros_like(states[slot])
        for i in range(start, start + new):
            xi = x[i]
            mixed = {n: xi + (prev - xi) * p[f"x_{n}"].view(-1) for n in "rwkvag"}
            r = mixed["r"] @ p["r_proj.weight"].T
            k = mixed["k"] @ p["k_proj.weight"].T
            v = mixed["v"] @ p["v_proj.weight"].T
            w = -torch.exp(torch.tensor(-0.5, dtype=x.dtype)) * torch.sigmoid(lora("w_lora", mixed["w"], torch.tanh))
            if layer_idx == 0:
                firsts[i] = v
            else:
                v = v + (v_first[i] - v) * torch.sigmoid(lora("v_lora", mixed["v"], lambda z: z))
            iclr = torch.sigmoid(lora("a_lora", mixed["a"], lambda z: z))
            g = lora("g_lora", mixed["g"], torch.sigmoid)
            kk = (k * p["k_k"]).view(heads, -1)
            kk = kk / torch.sqrt((kk * kk).sum(-1, keepdim=True) + 1e-6)
            k = k * (1 + (iclr - 1) * p["k_a"])
            rh, kh, vh, wh, ih = r.view(heads, -1), k.view(heads, -1), v.view(heads, -1), w.view(heads, -1), \
                iclr.view(heads, -1)
            removed = torch.einsum("hk,hkv->hv", kk, s)
            s = s * torch.exp(wh)[:, :, None] - (kk * ih)[:, :, None] * removed[:, None, :] \
                + kh[:, :, None] * vh[:, None, :]
            o = torch.einsum("hkv,hk->hv", s, rh)
            o = (o - o.mean(-1, keepdim=True)) / torch.sqrt(o.var(-1, unbiased=False, keepdim=True) + HEAD * eps)
            o = o.reshape(-1) * p["g_norm.weight"] + p["g_norm.bias"]
            o = o + ((rh * kh * p["r_k"]).sum(-1, keepdim=True) * vh).reshape(-1)
            out[i] = (o * g) @ p["o_proj.weight"].T
            prev = xi
        shift[slot], states[slot] = prev, s
        start += new
    return out, (firsts if layer_idx == 0 else v_first)


def test_parameters_carry_flas_checkpoint_names():
    shapes = {n: tuple(t.shape) for n, t in _layer(1).state_dict().items()}
    mixes = {f"x_{n}": (1, 1, 128) for n in "rwkvag"}
    loras = {}
    for name, rank, out, bias in (("w", 8, 128, True), ("v", 4, 128, True), ("a", 8, 128, True),
                                  ("g", 16, 128, False)):
        loras[f"{name}_lora.lora.0.weight"] = (rank, 128)
        loras[f"{name}_lora.lora.2.weight"] = (out, rank)
        if bias:
            loras[f"{name}_lora.lora.2.bias"] = (out,)
    assert shapes == {**mixes, **loras, "k_k": (128,), "k_a": (128,), "r_k": (2, 64),
                      **{f"{n}_proj.weight": (128, 128) for n in "rkvo"},
                      "g_norm.weight": (128,), "g_norm.bias": (128,)}
    assert not any(n.startswith("v_lora") for n in _layer(0).state_dict())  # layer 0 makes v_first


@pytest.mark.parametrize("layer_idx", [1, 0])
def test_native_layer_is_flas_layer_semantics_in_float64(layer_idx):
    """Output, v_first and both pools equal the token-by-token re-implementation over a mixed step
    (decodes first, a fresh prompt whose slots hold garbage, a continued prompt); spare slots come
    back unchanged."""
    layer, meta, x, v_first, shift, states = _layer_and_step(torch.Generator().manual_seed(0), layer_idx)
    given = v_first if layer_idx else None
    got_shift, got_states, want_shift, want_states = shift.clone(), states.clone(), shift.clone(), states.clone()
    layer.state_cache = (got_shift, got_states)
    with set_forward_context(meta):
        out, first = layer.forward_native(x, given)
    want, want_first = fla_semantics(layer.state_dict(), x, given, want_shift, want_states, STEP, layer_idx, EPS)
    for got, ref in ((out, want), (first, want_first), (got_shift, want_shift), (got_states, want_states)):
        torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-10)
    for got, before in ((got_shift, shift), (got_states, states)):
        assert torch.equal(got[[1, 4]], before[[1, 4]]) and not torch.equal(got, before)


def test_fast_path_matches_the_float64_native_layer(monkeypatch):
    """With the core on its Triton kernel (as on a GPU, interpreted here), the layer in float32
    equals its float64 definition: output and both pools. One call per phase: decodes, prefills."""
    pytest.importorskip("triton")
    from kernels_reference.L1 import rwkv7
    from kernels_reference.ops.rwkv7 import chunk, recurrent

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    used = []
    for module, name in ((recurrent, "recurrent_forward"), (chunk, "chunk_forward")):
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _name=name, _original=original, **kw:
                            used.append((_name, a[0].tensor.numel() // HIDDEN)) or _original(*a, **kw))
    monkeypatch.setattr(rwkv7, "use_fast_path", lambda *tensors: True)
    truth, meta, x, v_first, shift, states = _layer_and_step(torch.Generator().manual_seed(1))
    layer = _layer(1)
    layer.load_state_dict(truth.state_dict())
    got_shift, got_states = shift.float(), states.float()
    layer.state_cache, truth.state_cache = (got_shift, got_states), (shift.clone(), states.clone())
    with set_forward_context(meta):
        out, _ = layer(x.float(), v_first.float())
        want, _ = truth.forward_native(x, v_first)
    # the decode phase's 2 tokens through the recurrent kernel, then the prefills' 66 + 7 chunked
    assert used == [("recurrent_forward", 2), ("chunk_forward", 73)]
    for got, ref in ((out, want), (got_shift, truth.state_cache[0]), (got_states, truth.state_cache[1])):
        assert float((got.double() - ref).norm() / ref.norm()) < 1e-5


def test_a_fresh_one_token_prompt_reads_neither_pool():
    """A 1-token prompt has no state to continue: its slots' leftovers (shift row and state) must
    not reach its output."""
    layer, _, x, v_first, shift, states = _layer_and_step(torch.Generator().manual_seed(2))
    meta = AttentionMetadata.build([0], [1], 16, state_slots=[3])
    outs = []
    for scale in (1.0, 100.0):  # change only the garbage in the slots
        layer.state_cache = (shift * scale, states * scale)
        with set_forward_context(meta):
            outs.append(layer.forward_native(x[:1], v_first[:1])[0])
    assert torch.equal(outs[0], outs[1])


# ---- verdicts through the real machinery -----------------------------------------------------------
def test_honest_example_passes():
    assert_passes_every_case(TASK, EXAMPLES)


def _continuing(case):
    return any(c > 0 for c in case["context"])


def _decode_only(case):
    return all(q == 1 for q in case["query"])


@pytest.mark.parametrize("tree, failing", [
    ("rwkv7_attn_shift_ignores_carry", _continuing),
    ("rwkv7_attn_shift_not_stored", lambda case: True),
    ("rwkv7_attn_no_bonus", lambda case: True),
    ("rwkv7_attn_decode_batch_slots", _decode_only),
], ids=["shift-ignores-carry", "shift-not-stored", "no-bonus", "decode-batch-slots"])
def test_wrong_candidates_fail_exactly_where_their_bug_shows(tree, failing):
    """A token shift that starts every sequence from zeros fails the steps with a continuing
    sequence (all but the layer-0 all-fresh prefill); a shift row never stored fails every step
    (each writes rows into the whole-compared pool); a dropped bonus fails every case; addressing
    the pools by batch position on decode-only steps fails those steps only."""
    assert_fails_exactly(TASK, tree, failing)
