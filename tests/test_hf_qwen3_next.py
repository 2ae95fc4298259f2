"""Qwen3-Next's modules against HF transformers' (same weights, same inputs)."""
import pytest
import torch

from kernels_reference.L1.gemma_rms_norm import GemmaRMSNorm

from tasks.state_steps import draw_hf_state_model, logits_over_steps

modeling = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemma_rms_norm_is_hf_qwen3_next_rms_norm(dtype):
    gen = torch.Generator().manual_seed(0)
    ours, hf = GemmaRMSNorm(256, eps=1e-6), modeling.Qwen3NextRMSNorm(256, eps=1e-6)
    with torch.no_grad():
        hf.weight.copy_(0.2 * torch.randn(256, generator=gen))
    ours.load_state_dict(hf.state_dict())  # the checkpoint's zero-centred weight, as stored
    ours, hf = ours.to(dtype), hf.to(dtype)
    x = torch.randn(5, 3, 256, generator=gen).to(dtype)
    torch.testing.assert_close(ours.forward_native(x), hf(x), rtol=0, atol=0)


def test_gated_attention_block_is_hf_qwen3_next_attention():
    """Prefill of one prompt and then a decode step through the paged cache: our block's native
    path in float32 against HF's ``Qwen3NextAttention`` on the same checkpoint tensors."""
    from kernels_reference.forward_context import AttentionMetadata, set_forward_context
    from kernels_reference.L2.qwen3_next_attention import Qwen3NextAttention

    cfg = modeling.Qwen3NextConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                   partial_rotary_factor=0.25, rope_theta=1e6, max_position_embeddings=512,
                                   rms_norm_eps=1e-6, num_hidden_layers=1, layer_types=["full_attention"])
    cfg._attn_implementation = "eager"
    gen = torch.Generator().manual_seed(0)
    hf = modeling.Qwen3NextAttention(cfg, layer_idx=0).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(0.2 * torch.randn(p.shape, generator=gen) if p.dim() == 1 else
                    torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5)
    ours = Qwen3NextAttention(256, 4, 2, 64, 512, 1e6, 0.25, 1e-6).eval()
    sd = hf.state_dict()
    ours.load_state_dict({"qkv_proj.weight": torch.cat([sd["q_proj.weight"], sd["k_proj.weight"], sd["v_proj.weight"]]),
                          "o_proj.weight": sd["o_proj.weight"], "q_norm.weight": sd["q_norm.weight"],
                          "k_norm.weight": sd["k_norm.weight"]})
    t = 11
    x = torch.randn(1, t, 256, generator=gen)
    positions = torch.arange(t)[None]
    cos, sin = modeling.Qwen3NextRotaryEmbedding(cfg)(x, positions)
    mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        expected = hf(x, position_embeddings=(cos, sin), attention_mask=mask)[0][0]
        block = 16
        cache = (torch.zeros(4, block, 2, 64), torch.zeros(4, block, 2, 64))
        ours.attn.kv_cache = cache
        # The first t - 1 tokens as a prefill, the last as a decode step reading them from the cache.
        with set_forward_context(AttentionMetadata.build([0], [t - 1], block, block_tables=[[2]])):
            first = ours.forward_native(positions[0, :-1], x[0, :-1])
        with set_forward_context(AttentionMetadata.build([t - 1], [1], block, block_tables=[[2]])):
            last = ours.forward_native(positions[0, -1:], x[0, -1:])
    torch.testing.assert_close(torch.cat([first, last]), expected, rtol=1e-4, atol=1e-5)


# ---- the gated DeltaNet block ------------------------------------------------------------------------
GDN = dict(hidden_size=64, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
           linear_value_head_dim=8, linear_conv_kernel_dim=4, rms_norm_eps=1e-6)


def _hf_gated_delta_net(gen):
    cfg = modeling.Qwen3NextConfig(num_hidden_layers=1, layer_types=["linear_attention"], **GDN)
    hf = modeling.Qwen3NextGatedDeltaNet(cfg, layer_idx=0).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name == "A_log":  # decay rates from slow to fast, as trained layers have
                p.copy_(torch.linspace(0.02, 4.0, p.numel()).log())
            elif p.dim() == 1:  # dt_bias, and the gated norm's plain (not zero-centred) weight
                p.copy_((1.0 if name == "norm.weight" else 0.0) + 0.3 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5)
    return hf


def _our_gated_delta_net(hf):
    from kernels_reference.L2.qwen3_next_gated_delta_net import Qwen3NextGatedDeltaNet

    ours = Qwen3NextGatedDeltaNet(GDN["hidden_size"], GDN["linear_num_key_heads"], GDN["linear_num_value_heads"],
                                  GDN["linear_key_head_dim"], GDN["linear_value_head_dim"],
                                  GDN["linear_conv_kernel_dim"], GDN["rms_norm_eps"]).eval()
    ours.load_state_dict(hf.state_dict())  # vLLM loads the checkpoint's names and layouts unchanged
    return ours


def test_gated_norm_is_hf_qwen3_next_rms_norm_gated():
    """HF's Qwen3NextRMSNormGated is RMSNormGated(head_v_dim, norm_before_gate=True) with a plain
    weight (ones-initialised, used as is: not the 1 + w of the zero-centred Qwen3NextRMSNorm)."""
    from kernels_reference.L1.rms_norm_gated import RMSNormGated

    gen = torch.Generator().manual_seed(0)
    hf = modeling.Qwen3NextRMSNormGated(128, eps=1e-6)
    assert torch.equal(hf.weight, torch.ones(128))
    with torch.no_grad():
        hf.weight.copy_(1 + 0.3 * torch.randn(128, generator=gen))
    ours = RMSNormGated(128, eps=1e-6, group_size=None, norm_before_gate=True)
    ours.load_state_dict(hf.state_dict())
    x, z = torch.randn(2, 6, 128, generator=gen), torch.randn(2, 6, 128, generator=gen)
    torch.testing.assert_close(ours.forward_native(x, z), hf(x, z), rtol=1e-6, atol=1e-6)


def test_gated_delta_net_block_is_hf_qwen3_next_gated_delta_net():
    """Two prompts prefilled fresh, then a mixed step (one decodes, the other continues its prefill),
    then a decode step of both, through the state pools: each output row of our native block in
    float32 equals HF's ``Qwen3NextGatedDeltaNet`` run on the whole sequence so far without a cache."""
    from kernels_reference.forward_context import AttentionMetadata, set_forward_context

    gen = torch.Generator().manual_seed(0)
    hf = _hf_gated_delta_net(gen)
    ours = _our_gated_delta_net(hf)
    # sequence -> its tokens; steps: (sequences, tokens each) with decodes first, as vLLM orders them
    lengths = {"a": 5 + 1 + 1, "b": 70 + 9 + 1}
    x = {s: torch.randn(n, GDN["hidden_size"], generator=gen) for s, n in lengths.items()}
    steps = [(("a", "b"), (5, 70)), (("a", "b"), (1, 9)), (("b", "a"), (1, 1))]
    slots = {"a": 2, "b": 0}
    key_dim = GDN["linear_num_key_heads"] * GDN["linear_key_head_dim"]
    value_dim = GDN["linear_num_value_heads"] * GDN["linear_value_head_dim"]
    # Every slot starts with garbage: the fresh sequences must not read it.
    conv_states = torch.randn(4, GDN["linear_conv_kernel_dim"] - 1, 2 * key_dim + value_dim, generator=gen)
    ssm_states = torch.randn(4, GDN["linear_num_value_heads"], GDN["linear_key_head_dim"],
                             GDN["linear_value_head_dim"], generator=gen)
    ours.state_cache = (conv_states, ssm_states)
    done = {s: 0 for s in lengths}
    got = {s: [] for s in lengths}
    with torch.no_grad():
        for seqs, counts in steps:
            meta = AttentionMetadata.build([done[s] for s in seqs], list(counts), 16,
                                           state_slots=[slots[s] for s in seqs])
            batch = torch.cat([x[s][done[s]: done[s] + n] for s, n in zip(seqs, counts)])
            with set_forward_context(meta):
                out = ours.forward_native(batch)
            for s, part in zip(seqs, out.split(list(counts))):
                got[s].append(part)
                done[s] += part.shape[0]
        for s in lengths:
            expected = hf(x[s][None])[0]
            torch.testing.assert_close(torch.cat(got[s]), expected, rtol=1e-4, atol=1e-5)


# ---- the whole model ---------------------------------------------------------------------------------
# Four layers hold Qwen3-Next's pattern once (three gated DeltaNet layers, then full attention);
# 8 experts, top 2, so that routing (and a renormalised top-k) is exercised.
MODEL = dict(GDN, vocab_size=96, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32, partial_rotary_factor=0.25, rope_theta=1e6,
             max_position_embeddings=512, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
             shared_expert_intermediate_size=48, norm_topk_prob=True, tie_word_embeddings=False)


def _hf_model(gen):
    cfg = modeling.Qwen3NextConfig(**MODEL)
    cfg._attn_implementation = "eager"
    return cfg, draw_hf_state_model(modeling.Qwen3NextForCausalLM(cfg).eval(), gen, centred_norms=True)


def _routing_gap(hf, ids):
    """The smallest gap between the k-th and (k+1)-th router logit over every MoE call of HF's run."""
    gaps = []

    def record(module, args, out):
        top = torch.topk(out[0].double(), module.top_k + 1, dim=-1).values
        gaps.append((top[:, -2] - top[:, -1]).min())
    hooks = [m.register_forward_hook(record) for m in hf.modules() if isinstance(m, modeling.Qwen3NextTopKRouter)]
    with torch.no_grad():
        logits = hf(ids[None]).logits[0]
    for h in hooks:
        h.remove()
    return logits, min(gaps)


# Two prompts prefilled together (fresh; b crosses the delta rule's 64-token chunk and several
# cache blocks), a mixed step (a decodes, b continues its prompt), then decode steps of both.
PROMPTS = {"a": 9, "b": 70}
STEPS = [(("a", "b"), (9, 70)), (("a", "b"), (1, 6))] + [(("b", "a"), (1, 1))] * 3
LENGTHS = {"a": 9 + 1 + 3, "b": 70 + 6 + 3}
SLOTS = {"a": 3, "b": 1}
TABLES = {"a": [7, 2], "b": [0, 5, 9, 4, 11, 6]}  # blocks a block manager handed out after some churn
BLOCK = 16


def our_model(hf, gen):
    """Our model loaded from HF's state_dict, its KV caches and state pools allocated and filled
    with garbage (an earlier owner's leftovers: fresh sequences must not read them)."""
    from kernels_reference.L4.qwen3_next import Qwen3NextForCausalLM

    ours = Qwen3NextForCausalLM(hf.config).eval()
    ours.load_weights(hf.state_dict().items())
    ours.allocate_kv_cache(num_blocks=12, block_size=BLOCK)
    pools = ours.allocate_state_pools(num_slots=5)
    with torch.no_grad():
        for memory in pools + [attn.kv_cache for attn in ours.attention_layers()]:
            for tensor in memory:
                tensor.normal_(generator=gen)
    return ours


def run_model_steps(model, ids, method="forward_native"):
    """Each sequence's logits over ``STEPS``, through the model's bound caches and pools."""
    return logits_over_steps(model, ids, STEPS, SLOTS, BLOCK, TABLES, method)


def test_model_is_hf_qwen3_next_for_causal_lm():
    """A prefill of two prompts, a mixed step and decode steps through the paged KV cache of the
    attention layer and the state pools of the three linear layers (garbage-filled): our model's
    native logits in float32 equal HF's ``Qwen3NextForCausalLM`` recomputing each whole sequence
    without a cache. The router's top-k boundary is checked to be far from a tie (else a rounding
    could flip an expert and the comparison would say nothing about the kernels)."""
    gen = torch.Generator().manual_seed(0)
    cfg, hf = _hf_model(gen)
    assert cfg.layer_types == ["linear_attention"] * 3 + ["full_attention"]
    ours = our_model(hf, gen)
    ids = {s: torch.randint(0, MODEL["vocab_size"], (n,), generator=gen) for s, n in LENGTHS.items()}
    got = run_model_steps(ours, ids)
    for s in LENGTHS:
        expected, gap = _routing_gap(hf, ids[s])
        assert gap > 1e-4, f"a router near-tie ({gap:.2e}) in sequence {s}: draw other weights"
        torch.testing.assert_close(got[s], expected, rtol=1e-4, atol=1e-4)


def test_model_loads_the_hub_checkpoint_layout():
    """The Hub's shards name each expert's matrices (``mlp.experts.{e}.gate_proj/up_proj/down_proj``)
    and carry a multi-token-prediction head (``mtp.*``, a draft model's): loaded, they give the
    same parameters as transformers 5's fused experts, and the mtp tensors are skipped."""
    from kernels_reference.L4.qwen3_next import Qwen3NextForCausalLM

    gen = torch.Generator().manual_seed(1)
    cfg, hf = _hf_model(gen)
    fused = Qwen3NextForCausalLM(cfg)
    fused.load_weights(hf.state_dict().items())
    hub = []
    for name, tensor in hf.state_dict().items():
        if name.endswith("mlp.experts.gate_up_proj"):
            prefix, half = name[: -len("gate_up_proj")], tensor.shape[1] // 2
            for e in range(tensor.shape[0]):
                hub += [(f"{prefix}{e}.gate_proj.weight", tensor[e, :half]),
                        (f"{prefix}{e}.up_proj.weight", tensor[e, half:])]
        elif name.endswith("mlp.experts.down_proj"):
            hub += [(f"{name[: -len('down_proj')]}{e}.down_proj.weight", tensor[e]) for e in range(tensor.shape[0])]
        else:
            hub.append((name, tensor))
    hub.append(("mtp.fc.weight", torch.zeros(3, 3)))
    ours = Qwen3NextForCausalLM(cfg)
    ours.load_weights(hub)
    for (name, p), q in zip(ours.state_dict().items(), fused.state_dict().values()):
        assert torch.equal(p, q), name
