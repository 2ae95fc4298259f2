"""Our Llama-family L4 models reproduce HF transformers' logits (tiny random configs, float32).

For each architecture: the same weights (loaded through HF checkpoint names) give the same logits
for (a) a packed batch of variable-length prompts, (b) chunked prefill reading the first chunk from
the paged KV cache, and (c) incremental decode token by token through the paged cache. The bar is
calibrated: our float32 error against HF in float64 must stay within 2x HF float32's own error
(with a 1e-6 floor).
"""
import pytest
import torch

transformers = pytest.importorskip("transformers")

from kernels_reference.forward_context import AttentionMetadata, set_forward_context  # noqa: E402
from kernels_reference.L4.llama import model_for  # noqa: E402

LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 64}
COMMON = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(**COMMON, rms_norm_eps=1e-5, rope_theta=500000.0,
                                              rope_scaling=LLAMA3_SCALING),
    "qwen2": lambda: transformers.Qwen2Config(**COMMON, rms_norm_eps=1e-6, rope_theta=1e6),
    "qwen3": lambda: transformers.Qwen3Config(**COMMON, head_dim=32, rms_norm_eps=1e-6, rope_theta=1e6),
    "mistral": lambda: transformers.MistralConfig(**COMMON, rms_norm_eps=1e-5, rope_theta=1e6, sliding_window=None),
}
BLOCK = 4


def _hf_and_ours(arch):
    torch.manual_seed(0)
    config = CONFIGS[arch]()
    hf = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # HF initialises norms to ones and biases to zeros: randomise them all
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    ours = model_for(config).eval()
    ours.load_weights(hf.state_dict().items())
    return hf, ours


def _hf_logits(hf, ids, dtype):
    model = hf.to(dtype)
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].double()


def _check(ours_logits, hf32, hf64):
    e_ours = float((ours_logits.double() - hf64).norm() / hf64.norm())
    e_hf = float((hf32 - hf64).norm() / hf64.norm())
    assert e_ours <= 2 * max(e_hf, 1e-6), (e_ours, e_hf)


def _run(model, ids, metadata):
    with torch.no_grad(), set_forward_context(metadata):
        return model.compute_logits(model(torch.tensor(ids), metadata.positions()))


@pytest.mark.parametrize("arch", list(CONFIGS))
def test_packed_prefill_of_variable_length_prompts(arch):
    hf, ours = _hf_and_ours(arch)
    prompts = [[int(x) for x in torch.randint(0, 97, (n,))] for n in (5, 11, 1, 8)]
    ours.allocate_kv_cache(num_blocks=32, block_size=BLOCK)
    meta = AttentionMetadata.build([0] * len(prompts), [len(p) for p in prompts], BLOCK)
    logits = _run(ours, sum(prompts, []), meta)
    start = 0
    for p in prompts:
        hf64, hf32 = _hf_logits(hf, p, torch.float64), _hf_logits(hf, p, torch.float32)
        _check(logits[start:start + len(p)], hf32, hf64)
        start += len(p)


@pytest.mark.parametrize("arch", list(CONFIGS))
def test_chunked_prefill_then_token_by_token_decode_through_the_paged_cache(arch):
    hf, ours = _hf_and_ours(arch)
    seqs = [[int(x) for x in torch.randint(0, 97, (n,))] for n in (13, 7)]
    ours.allocate_kv_cache(num_blocks=16, block_size=BLOCK)
    # Non-contiguous, interleaved blocks, as a block manager hands them out.
    tables = [[0, 2, 4, 6, 8, 10], [1, 3, 5, 7, 9, 11]]
    prompt = [6, 4]  # prefill in two chunks: 3 then the rest of the prompt
    rows = {0: [], 1: []}
    for ctx, q in (((0, 0), (3, 3)), ((3, 3), (3, 1))):
        meta = AttentionMetadata.build(list(ctx), list(q), BLOCK, block_tables=tables)
        ids = seqs[0][ctx[0]:ctx[0] + q[0]] + seqs[1][ctx[1]:ctx[1] + q[1]]
        out = _run(ours, ids, meta)
        rows[0].append(out[:q[0]])
        rows[1].append(out[q[0]:])
    done = [sum(x.shape[0] for x in rows[i]) for i in (0, 1)]
    assert done == prompt
    while done[0] < len(seqs[0]) or done[1] < len(seqs[1]):  # decode, one token per live sequence
        live = [i for i in (0, 1) if done[i] < len(seqs[i])]
        meta = AttentionMetadata.build([done[i] for i in live], [1] * len(live), BLOCK,
                                       block_tables=[tables[i] for i in live])
        out = _run(ours, [seqs[i][done[i]] for i in live], meta)
        for j, i in enumerate(live):
            rows[i].append(out[j:j + 1])
            done[i] += 1
    for i in (0, 1):
        hf64, hf32 = _hf_logits(hf, seqs[i], torch.float64), _hf_logits(hf, seqs[i], torch.float32)
        _check(torch.cat(rows[i]), hf32, hf64)


def test_weight_loading_refuses_a_missing_or_misshapen_weight():
    hf, ours = _hf_and_ours("qwen2")
    state = dict(hf.state_dict())
    state.pop("model.layers.1.self_attn.k_proj.bias")
    with pytest.raises(KeyError, match="missing"):
        ours.load_weights(state.items())
    state = dict(hf.state_dict())
    state["model.norm.weight"] = torch.ones(3)
    with pytest.raises(ValueError, match="shape"):
        ours.load_weights(state.items())


def test_loads_an_hf_safetensors_checkpoint(tmp_path):
    safetensors = pytest.importorskip("safetensors.torch")
    hf, ours = _hf_and_ours("qwen3")
    state = {k: v.contiguous() for k, v in hf.state_dict().items() if k != "lm_head.weight" or not ours.config.tie_word_embeddings}
    half = len(state) // 2
    keys = sorted(state)
    paths = []
    for i, part in enumerate((keys[:half], keys[half:])):  # a sharded checkpoint, as HF writes them
        path = tmp_path / f"model-0000{i + 1}-of-00002.safetensors"
        safetensors.save_file({k: state[k] for k in part}, str(path))
        paths.append(str(path))
    fresh = type(ours)(ours.config)
    fresh.load_safetensors(paths)
    for (name, a), (_, b) in zip(sorted(fresh.state_dict().items()), sorted(ours.state_dict().items())):
        assert torch.equal(a, b), name
