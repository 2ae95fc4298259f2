"""The engine serves the MoE models unchanged (Mixtral, Qwen3-MoE, DeepSeek-V2 with its paged
latent cache): tiny random configs on the CPU, float64 (so greedy tokens are exact, not near-tied).

For each: greedy tokens do not depend on chunked prefill (a small token budget splits the prompts)
and the padded decode path (static buffers padded to a bucket, as the CUDA graphs replay them,
run eagerly here) gives the eager path's tokens and leaves every real cache block as the eager
path wrote it (padding rows carry slot -1 and length 0).
"""
import sys

import pytest
import torch

from fk_pytest.candidates import CandidateSource
from fk_pytest.compose import candidate_lookup
from fk_pytest.e2e_run import EngineModel, compose_candidate
from fk_pytest.host_sync import HostSyncCheck, NotCapturable
from kernels_reference.engine import LLM, SamplingParams
from kernels_reference.L4.llama import init_random_weights, model_for

from conftest import EXAMPLES, check_candidate_host_syncs

ATTN = dict(vocab_size=101, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=10000.0)
CONFIGS = {
    "mixtral": dict(ATTN, architectures=["MixtralForCausalLM"], intermediate_size=24, num_local_experts=4,
                    num_experts_per_tok=2),
    "qwen3_moe": dict(ATTN, architectures=["Qwen3MoeForCausalLM"], head_dim=16, intermediate_size=48,
                      moe_intermediate_size=16, num_experts=8, num_experts_per_tok=3, norm_topk_prob=True,
                      mlp_only_layers=[0]),
    "deepseek_v2": dict(ATTN, architectures=["DeepseekV2ForCausalLM"], num_key_value_heads=4, intermediate_size=48,
                        q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
                        moe_intermediate_size=16, n_routed_experts=8, num_experts_per_tok=3, n_shared_experts=1,
                        first_k_dense_replace=1, routed_scaling_factor=2.0, topk_method="greedy",
                        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                                      "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}),
}
PROMPTS = [[5, 17, 2, 88, 41, 3, 9], [7], [60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71], [12, 40],
           [3, 1, 4, 1, 5]]  # 5 decoding sequences: bucket 8, three padding rows


def _model(arch):
    torch.manual_seed(0)
    return init_random_weights(model_for(CONFIGS[arch])).double().eval()


def _caches(model, num_blocks):
    out = []
    for attn in model.attention_layers():
        cache = attn.kv_cache
        out += [c[:num_blocks].clone() for c in (cache if isinstance(cache, tuple) else (cache,))]
    return out


@pytest.mark.parametrize("arch", list(CONFIGS))
def test_moe_models_generate_alike_chunked_and_padded(arch):
    model = _model(arch)
    assert type(model).__name__ == CONFIGS[arch]["architectures"][0]
    params = SamplingParams(max_tokens=6)
    alone = [LLM(model, num_blocks=16, block_size=4, chunked_prefill=False).generate([p], params)[0] for p in PROMPTS]
    chunked = LLM(model, num_blocks=64, block_size=4, max_num_batched_tokens=5)
    assert chunked.generate(PROMPTS, params) == alone
    eager_cache = _caches(model, 64)
    padded = LLM(model, num_blocks=64, block_size=4, max_num_batched_tokens=5, padded_decode=True, max_num_seqs=8)
    steps, run = [], padded.runner.decoder.run

    def spy(batch, graphs):
        steps.append((len(batch), padded.runner.decoder.bucket(len(batch))))
        return run(batch, graphs)
    padded.runner.decoder.run = spy
    assert padded.generate(PROMPTS, params) == alone
    assert any(bucket > n for n, bucket in steps), steps  # padding rows really ran
    for got, want in zip(_caches(model, 64), eager_cache):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)  # batch-shape rounding only
    assert len({tuple(o) for o in alone}) > 1  # the outputs depend on the prompt: not a constant model


def _example_attention_tree(tmp_path, boolean_store=False):
    """A candidate tree of only the example tree's attention and MLA files (its other files run
    CUDA-only branches under capture, which a CPU run cannot take)."""
    src = EXAMPLES / "L1"
    (tmp_path / "L1").mkdir()
    for name in ("attention.py", "mla_attention.py"):
        text = (src / name).read_text()
        if boolean_store and name == "mla_attention.py":  # the store as it was before the H200 showed the bug
            text = text.replace("store_rows(cache.view(-1, cache.shape[-1]), rows, meta.slot_mapping)",
                                "keep = meta.slot_mapping.long() >= 0\n"
                                "            cache.view(-1, cache.shape[-1])[meta.slot_mapping.long()[keep]] = "
                                "rows[keep].to(cache.dtype)")
        (tmp_path / "L1" / name).write_text(text)
    return tmp_path


def _decode_without_host_syncs(arch, tree, monkeypatch=None, decode_chunk=None):
    """Generate through padded decode steps (the path the GPU captures) with every module of the
    candidate tree run under a check that raises on the first operation a CUDA-graph capture
    cannot run (the reference's own CPU paths, which the GPU does not capture, are not checked)."""
    reference = _model(arch).float()
    model, composition = compose_candidate(reference, candidate_lookup(CandidateSource(tree)))
    checked = check_candidate_host_syncs(model, arch)
    assert checked, "the example attention was not composed into the model"
    if decode_chunk is not None:  # the examples walk the cache in chunks of this many positions
        for module in checked:
            monkeypatch.setattr(sys.modules[type(module).__module__], "DECODE_CHUNK", decode_chunk)
    llm = LLM(EngineModel(model, reference), num_blocks=64, block_size=4, padded_decode=True, max_num_seqs=8)
    return llm.generate(PROMPTS, SamplingParams(max_tokens=3))


@pytest.mark.parametrize("arch", ["mixtral", "deepseek_v2"])
def test_example_attention_decode_is_capturable(arch, tmp_path):
    # On the H200 the example MLA's boolean-mask cache store broke DeepSeek-V2's decode-graph capture
    # end to end; the CPU never captures, so the check stands in for it.
    _decode_without_host_syncs(arch, _example_attention_tree(tmp_path))


def test_host_sync_check_catches_a_boolean_mask_store(tmp_path):
    with pytest.raises(NotCapturable, match="boolean mask"):
        _decode_without_host_syncs("deepseek_v2", _example_attention_tree(tmp_path, boolean_store=True))


@pytest.mark.parametrize("arch", ["mixtral", "deepseek_v2"])
def test_example_attention_decode_in_chunks_gives_the_same_tokens(arch, tmp_path, monkeypatch):
    # On the GPU the examples' decode walks long block tables in many chunks; on these tiny tables
    # one chunk covers everything unless the chunk is made tiny (one block per chunk here).
    tree = _example_attention_tree(tmp_path)
    whole = _decode_without_host_syncs(arch, tree)
    assert _decode_without_host_syncs(arch, tree, monkeypatch, decode_chunk=4) == whole


@pytest.mark.parametrize("sync", [lambda x: x.sum().item(), lambda x: x[x > 0], lambda x: x.nonzero(),
                                  lambda x: x.tolist(), lambda x: torch.equal(x, x), lambda x: int(x[0]),
                                  lambda x: bool(x[0] > 0), lambda x: x.numpy()])
def test_host_sync_check_flags_each_kind_of_host_sync(sync):
    x = torch.randn(8)
    with pytest.raises(NotCapturable), HostSyncCheck():
        sync(x)


def test_host_sync_check_lets_capturable_code_run():
    x, index = torch.randn(8), torch.tensor([3, 1])
    with HostSyncCheck():
        y = torch.where(x > 0, x, 0.0).index_select(0, index) + x.sum()
    assert y.shape == (2,)
