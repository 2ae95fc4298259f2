"""Mamba-2's mixer against HF transformers' ``Mamba2Mixer`` (same checkpoint tensors, same inputs).

The tiny config has two groups (so B/C sharing and the grouped gated norm both matter), a 16-token
chunk (so the prompts cross chunk boundaries) and a conv bias, as mamba2-2.7b has."""
import math

import pytest
import torch

from tasks.state_steps import logits_over_steps

modeling = pytest.importorskip("transformers.models.mamba2.modeling_mamba2")

TINY = dict(hidden_size=64, num_heads=4, head_dim=32, expand=2, state_size=16, n_groups=2, conv_kernel=4,
            chunk_size=16, use_conv_bias=True, use_bias=False, layer_norm_epsilon=1e-5, num_hidden_layers=1)


def _hf_mixer(gen):
    cfg = modeling.Mamba2Config(**TINY)
    hf = modeling.Mamba2Mixer(cfg, layer_idx=0).eval()
    heads = TINY["num_heads"]
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name == "A_log":  # decay rates from slow to fast, as mamba-ssm draws them
                p.copy_(torch.linspace(1.0, 16.0, heads).log())
            elif name == "dt_bias":  # softplus(dt_bias) spread over [1e-3, 0.1]
                step = torch.exp(torch.linspace(math.log(1e-3), math.log(0.1), heads))
                p.copy_(step + torch.log(-torch.expm1(-step)))
            elif name in ("D", "norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name == "conv1d.weight":
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            elif name == "conv1d.bias":
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5)
    return hf


def checkpoint_to_vllm(sd):
    """vLLM's loader: every name as stored, except ``A_log``, loaded into ``A`` as -exp(A_log)."""
    out = {k: v for k, v in sd.items() if k != "A_log"}
    out["A"] = -torch.exp(sd["A_log"].float())
    return out


def _our_mixer(hf):
    from kernels_reference.L2.mamba_mixer2 import MambaMixer2

    ours = MambaMixer2(TINY["hidden_size"], TINY["state_size"], TINY["conv_kernel"],
                       TINY["expand"] * TINY["hidden_size"], TINY["use_conv_bias"], TINY["use_bias"],
                       n_groups=TINY["n_groups"], num_heads=TINY["num_heads"], head_dim=TINY["head_dim"],
                       rms_norm_eps=TINY["layer_norm_epsilon"], chunk_size=TINY["chunk_size"]).eval()
    ours.load_state_dict(checkpoint_to_vllm(hf.state_dict()))
    return ours


def test_gated_norm_is_hf_mamba2_rms_norm_gated():
    """HF's Mamba2RMSNormGated is RMSNormGated(I, group_size=I / n_groups, norm_before_gate=False)."""
    from kernels_reference.L1.rms_norm_gated import RMSNormGated

    gen = torch.Generator().manual_seed(0)
    hf = modeling.Mamba2RMSNormGated(128, group_size=64, eps=1e-5)
    with torch.no_grad():
        hf.weight.copy_(1 + 0.3 * torch.randn(128, generator=gen))
    ours = RMSNormGated(128, eps=1e-5, group_size=64, norm_before_gate=False)
    ours.load_state_dict(hf.state_dict())
    x, z = torch.randn(7, 128, generator=gen), torch.randn(7, 128, generator=gen)
    torch.testing.assert_close(ours.forward_native(x, z), hf(x, z), rtol=1e-6, atol=1e-6)


def run_steps(block, x, steps, slots, pools, method="forward_native"):
    """Feed ``block`` the steps ``(sequences, tokens each)`` (decodes first, as vLLM orders them)
    through the bound state pools; each sequence's outputs, concatenated over the steps."""
    from kernels_reference.forward_context import AttentionMetadata, set_forward_context

    block.state_cache = pools
    done = {s: 0 for s in x}
    got = {s: [] for s in x}
    with torch.no_grad():
        for seqs, counts in steps:
            meta = AttentionMetadata.build([done[s] for s in seqs], list(counts), 16,
                                           state_slots=[slots[s] for s in seqs])
            batch = torch.cat([x[s][done[s]: done[s] + n] for s, n in zip(seqs, counts)])
            with set_forward_context(meta):
                out = getattr(block, method)(batch)
            for s, part in zip(seqs, out.split(list(counts))):
                got[s].append(part)
                done[s] += part.shape[0]
    return {s: torch.cat(parts) for s, parts in got.items()}


# sequence -> tokens; steps: two prompts prefilled fresh (b over two chunks), a mixed step (a
# decodes, b continues its prefill across another chunk boundary, c arrives fresh beside it), then
# decode steps.
LENGTHS = {"a": 5 + 1 + 1 + 1, "b": 37 + 9 + 1 + 1, "c": 20 + 1}
STEPS = [(("a", "b"), (5, 37)), (("a", "b", "c"), (1, 9, 20)), (("b", "a", "c"), (1, 1, 1)),
         (("a", "b"), (1, 1))]
SLOTS = {"a": 3, "b": 1, "c": 0}


def garbage_pools(mixer, gen, slots=5):
    """Every slot starts with garbage: the fresh sequences must not read it."""
    conv = torch.randn(slots, TINY["conv_kernel"] - 1, mixer.conv_dim, generator=gen)
    ssm = torch.randn(slots, TINY["num_heads"], TINY["head_dim"], TINY["state_size"], generator=gen)
    return conv, ssm


def test_mixer_is_hf_mamba2_mixer():
    """Each output row of our native block in float32, over prefill, mixed and decode steps through
    the state pools, equals HF's ``Mamba2Mixer`` run on the whole sequence so far without a cache;
    slots no sequence owns come back unchanged."""
    gen = torch.Generator().manual_seed(0)
    hf = _hf_mixer(gen)
    ours = _our_mixer(hf)
    x = {s: torch.randn(n, TINY["hidden_size"], generator=gen) for s, n in LENGTHS.items()}
    conv, ssm = garbage_pools(ours, gen)
    conv0, ssm0 = conv.clone(), ssm.clone()
    got = run_steps(ours, x, STEPS, SLOTS, (conv, ssm))
    with torch.no_grad():
        for s in LENGTHS:
            torch.testing.assert_close(got[s], hf(x[s][None])[0], rtol=1e-4, atol=1e-5)
    unowned = [i for i in range(conv.shape[0]) if i not in SLOTS.values()]
    assert torch.equal(conv[unowned], conv0[unowned]) and torch.equal(ssm[unowned], ssm0[unowned])



# ---- the whole model: HF's Mamba2ForCausalLM against ours (tied head, two layers) -----------------
VOCAB = 97


def _hf_model(gen):
    """HF's model at the tiny config, two layers, with the mixers' parameters drawn as ``_hf_mixer``
    draws them (norms near 1, embeddings at unit-size rows)."""
    cfg = modeling.Mamba2Config(**dict(TINY, num_hidden_layers=2, vocab_size=VOCAB, tie_word_embeddings=True))
    hf = modeling.Mamba2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for i, block in enumerate(hf.backbone.layers):
            block.mixer.load_state_dict(_hf_mixer(gen).state_dict())
            block.norm.weight.copy_(1.0 + 0.2 * torch.randn(TINY["hidden_size"], generator=gen))
        hf.backbone.norm_f.weight.copy_(1.0 + 0.2 * torch.randn(TINY["hidden_size"], generator=gen))
        hf.backbone.embeddings.weight.copy_(torch.randn(VOCAB, TINY["hidden_size"], generator=gen))
    assert hf.lm_head.weight.data_ptr() == hf.backbone.embeddings.weight.data_ptr()
    return hf


def _our_model(hf):
    from kernels_reference.L4.mamba2 import Mamba2ForCausalLM

    ours = Mamba2ForCausalLM(hf.config).eval()
    ours.load_weights(hf.state_dict().items())
    return ours


def run_model_steps(model, ids, steps, slots, method="forward_native"):
    """Each sequence's logits over ``steps`` through the model's bound state pools (no attention)."""
    return logits_over_steps(model, ids, steps, slots, 16, method=method)


def test_model_logits_are_hf_mamba2_for_causal_lm():
    """Logits of our model (loaded from HF's state_dict through ``load_weights``) in float32, over
    a prefill of two prompts, a mixed step and decode steps through pools from
    ``allocate_state_pools`` filled with garbage, equal HF's ``Mamba2ForCausalLM`` recomputing each
    whole sequence without a cache; spare slots come back unchanged."""
    gen = torch.Generator().manual_seed(2)
    hf = _hf_model(gen)
    ours = _our_model(hf)
    ids = {s: torch.randint(0, VOCAB, (n,), generator=gen) for s, n in LENGTHS.items()}
    pools = ours.allocate_state_pools(5)
    for conv, ssm in pools:
        conv.normal_(generator=gen)
        ssm.normal_(generator=gen)
    before = [tuple(p.clone() for p in pair) for pair in pools]
    got = run_model_steps(ours, ids, STEPS, SLOTS)
    with torch.no_grad():
        for s in LENGTHS:
            expected = hf(input_ids=ids[s][None], use_cache=False).logits[0]
            torch.testing.assert_close(got[s], expected, rtol=1e-4, atol=1e-4)
    unowned = [i for i in range(5) if i not in SLOTS.values()]
    for pair, old in zip(pools, before):
        assert all(torch.equal(p[unowned], q[unowned]) for p, q in zip(pair, old))


def test_model_loads_mamba_ssm_names():
    """A mamba-ssm checkpoint (``backbone.embedding``, no ``lm_head`` for the tied head) loads to
    the same parameters as HF's names; ``A`` is -exp(A_log) in float32."""
    from kernels_reference.L4.mamba2 import Mamba2ForCausalLM

    hf = _hf_model(torch.Generator().manual_seed(4))
    ours = _our_model(hf)
    ssm_names = {k.replace("backbone.embeddings.", "backbone.embedding."): v for k, v in hf.state_dict().items()
                 if k != "lm_head.weight"}
    other = Mamba2ForCausalLM(hf.config)
    other.load_weights(ssm_names.items())
    for (name, p), q in zip(ours.state_dict().items(), other.state_dict().values()):
        assert torch.equal(p, q), name
    a_log = hf.backbone.layers[1].mixer.A_log
    assert other.backbone.layers[1].mixer.A.dtype == torch.float32
    torch.testing.assert_close(other.backbone.layers[1].mixer.A, -torch.exp(a_log.float()))
