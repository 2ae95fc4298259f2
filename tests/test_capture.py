"""Scenarios, workload capture and the loader that turns captures into task cases (tiny configs, CPU)."""
import json
import math
import statistics

import pytest
import torch

from kernels_reference.engine.capture import capture, capture_model, coarse
from kernels_reference.engine.scenarios import SCENARIOS, LengthDistribution, Scenario

TINY = {"architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 256}
ENGINE = {"max_num_seqs": 8, "max_num_batched_tokens": 64, "block_size": 4, "chunked_prefill": True}
# 3 prompts of 10 tokens fit one 64-token step; then 3 decode steps of 3 sequences (4 outputs each:
# the first is sampled from the prefill step).
THREE = Scenario("three", "3 requests, 10-token prompts, 4 outputs", ENGINE, num_requests=3,
                 prompt=LengthDistribution(10), output=LengthDistribution(4))


def groups(result, cls):
    return [g for g in result["modules"] if g["class"] == cls]


def only(result, cls):
    (g,) = groups(result, cls)
    return g


# ---- scenarios --------------------------------------------------------------------------------------
def test_chat_lengths_follow_the_published_medians_and_are_seeded():
    chat = SCENARIOS["chat"]
    reqs = chat.requests(vocab_size=1000, seed=0)
    assert len(reqs) == chat.num_requests
    prompts, outputs = [len(p) for p, _ in reqs], [n for _, n in reqs]
    # log-normal around the Splitwise conversation medians (1020 prompt, 129 output tokens)
    assert 0.8 * 1020 < statistics.median(prompts) < 1.25 * 1020
    assert 0.8 * 129 < statistics.median(outputs) < 1.25 * 129
    assert min(prompts) >= 16 and max(prompts) <= 16384 and max(outputs) <= 2048
    assert statistics.pstdev(math.log(p) for p in prompts) > 0.5  # a spread, not a constant
    assert all(0 <= t < 1000 for p, _ in reqs for t in p)
    assert chat.requests(1000, seed=0) == reqs
    assert chat.requests(1000, seed=1) != reqs
    # the lengths do not depend on the vocabulary the ids come from
    assert [(len(p), n) for p, n in chat.requests(50, seed=0)] == [(len(p), n) for p, n in reqs]


def test_fixed_scenarios_and_scale():
    b32 = SCENARIOS["batch-32"].requests(100)
    assert len(b32) == 32 and {(len(p), n) for p, n in b32} == {(1024, 512)}
    assert len(SCENARIOS["batch-1"].requests(100)) == 1
    small = SCENARIOS["batch-32"].requests(100, scale=0.25)
    assert len(small) == 8 and {(len(p), n) for p, n in small} == {(256, 128)}
    with pytest.raises(ValueError, match="scale"):
        SCENARIOS["chat"].requests(100, scale=0)
    for s in SCENARIOS.values():
        assert {"max_num_seqs", "max_num_batched_tokens", "block_size"} <= set(s.engine_args)
        need = sum(-(-(len(p) + n) // 16) for p, n in s.requests(10, scale=0.1))
        assert s.num_blocks(16, scale=0.1) >= need


# ---- capture ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def three_meta():
    return capture(TINY, THREE, layers=None)


def test_capture_records_modules_shapes_and_counts(three_meta):
    r = three_meta
    assert r["steps"] == 4  # one prefill step, three decode steps
    classes = {g["class"] for g in r["modules"]}
    assert {"VocabParallelEmbedding", "LlamaModel", "LlamaDecoderLayer", "LlamaAttention", "QKVParallelLinear",
            "RotaryEmbedding", "Attention", "RowParallelLinear", "LlamaMLP", "MergedColumnParallelLinear",
            "SiluAndMul", "RMSNorm", "ParallelLMHead"} <= classes
    attn = only(r, "Attention")
    assert attn["init"] == {"num_heads": 4, "head_size": 8, "scale": 8 ** -0.5, "num_kv_heads": 2}
    # per layer: prefill of 30 tokens once, decode of T = 3 (the batch size) three times
    assert attn["counts"] == {"prefill": {"30": 2}, "decode": {"3": 6}} and attn["calls"] == 8
    # value is a column slice of the fused qkv output: rows strided by its width
    qkv_width = (4 + 2 * 2) * 8
    assert attn["args"]["value"] == {"shape": ["n", 16], "dtype": "bfloat16", "stride": [qkv_width, 1]}
    # the LM head sees one row per sequence
    assert only(r, "ParallelLMHead")["counts"] == {"prefill": {"3": 1}, "decode": {"3": 3}}
    # layer 0's input norm gets no residual; every other norm fuses the residual add
    norms = {json.dumps(g["args"]["residual"]): g["calls"] for g in groups(r, "RMSNorm")}
    assert norms["null"] == 4 and sum(norms.values()) == 4 * (2 * 2 + 1)
    mlp = only(r, "LlamaMLP")
    assert mlp["init"]["hidden_size"] == 32 and mlp["args"]["x"]["shape"] == ["n", 32]
    # steps: the prefill composition and the decode steps (contexts 10, 11, 12)
    steps = {json.dumps([s["decode"], s["prefill"]]): s["count"] for s in r["attention_steps"]}
    assert steps == {json.dumps([None, [[0, 10]] * 3]): 1, json.dumps([[3, 10, 10, 10, 10, 10], []]): 1,
                     json.dumps([[3, 11, 11, 11, 11, 11], []]): 1, json.dumps([[3, 12, 12, 12, 12, 12], []]): 1}


def _counts(result):
    return {(g["class"], json.dumps(g["init"], sort_keys=True), json.dumps(g["args"], sort_keys=True)):
            g["counts"] for g in result["modules"]}


def test_layer_counts_add_up_and_truncated_depth_matches_full(three_meta):
    four = capture(dict(TINY, num_hidden_layers=4), THREE, layers=None)
    assert only(four, "LlamaMLP")["calls"] == 2 * only(three_meta, "LlamaMLP")["calls"]
    assert only(four, "LlamaModel")["calls"] == only(three_meta, "LlamaModel")["calls"] == 4
    truncated = capture(dict(TINY, num_hidden_layers=4), THREE, layers=2)
    assert _counts(truncated) == _counts(four)
    for layer in groups(truncated, "LlamaDecoderLayer"):
        assert layer["init"]["config"]["num_hidden_layers"] == 4  # the real depth, not the run's
    with pytest.raises(ValueError, match=">= 2 layers"):
        capture(dict(TINY, num_hidden_layers=4), THREE, layers=1)


def _tiny_state_config(model: str, layers: int) -> dict:
    from tasks.configs import load_config
    from tasks.e2e import CPU_CUTS

    return dict(load_config(model), **dict(CPU_CUTS[model], num_hidden_layers=layers))


def test_a_hybrid_depth_cut_stands_each_kind_of_layer_for_its_own():
    """Qwen3-Next's 3 gated-DeltaNet : 1 attention pattern: a cut to its first 4 layers counts the
    attention layer for the attention layers and the DeltaNet layers for theirs, so every module's
    counts equal those of the whole depth; 3 layers hold no attention layer and are refused."""
    from kernels_reference.engine.capture import layer_kinds, layers_needed

    config = _tiny_state_config("qwen3-next-80b-a3b", 12)
    kinds = layer_kinds(config)
    assert kinds.count("full_attention") == 3 and layers_needed(kinds) == 4
    whole = capture(config, THREE, layers=None)
    cut = capture(config, THREE, layers=4)
    assert _counts(cut) == _counts(whole)
    steps = only(whole, "Qwen3NextModel")["calls"]
    assert sum(g["calls"] for g in groups(whole, "Attention")) == 3 * steps
    assert sum(g["calls"] for g in groups(whole, "GatedDeltaRule")) == 9 * steps
    with pytest.raises(ValueError, match="full_attention"):
        capture(config, THREE, layers=3)
    mamba = _tiny_state_config("mamba2-2.7b", 5)
    assert layers_needed(layer_kinds(mamba)) == 2
    assert _counts(capture(mamba, THREE, layers=2)) == _counts(capture(mamba, THREE, layers=None))


def test_shape_only_capture_equals_a_computed_one(three_meta):
    torch.manual_seed(0)
    computed = capture(TINY, THREE, layers=None, device="cpu", dtype=torch.float32)
    meta32 = capture(TINY, THREE, layers=None, dtype=torch.float32)
    assert _counts(computed) == _counts(meta32)
    assert computed["attention_steps"] == meta32["attention_steps"]


def test_coarse_keeps_five_significant_bits_rounding_down():
    assert [coarse(x) for x in range(32)] == list(range(32))
    assert [coarse(x) for x in (33, 63, 1000, 1023, 32769)] == [32, 62, 992, 992, 32768]
    assert all(x - x / 16 < coarse(x) <= x for x in range(1, 5000))
    assert len({coarse(x) for x in range(1024, 2048)}) == 16  # 16 steps of 64 per octave


# ---- loader -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A capture of the tiny model for every scenario the loader mixes, in a temporary directory."""
    scenarios = [Scenario("chat", "tiny chat", ENGINE, num_requests=6, prompt=LengthDistribution(12, 0.8, 2, 60),
                          output=LengthDistribution(5, 0.8, 1, 20)),
                 Scenario("long-context", "tiny long", ENGINE, num_requests=2, prompt=LengthDistribution(150),
                          output=LengthDistribution(3)),
                 Scenario("batch-1", "tiny b1", ENGINE, num_requests=1, prompt=LengthDistribution(9),
                          output=LengthDistribution(8)),
                 Scenario("batch-32", "tiny b4", ENGINE, num_requests=4, prompt=LengthDistribution(9),
                          output=LengthDistribution(8))]
    directory = tmp_path_factory.mktemp("workloads")
    data = capture_model(TINY, scenarios, model_name="tiny", layers=None)
    (directory / "tiny.json").write_text(json.dumps(data))
    return directory


@pytest.fixture
def tiny_workloads(tiny_dir, monkeypatch):
    import tasks.workloads as W

    monkeypatch.setattr(W, "_DIR", tiny_dir)
    W.load_capture.cache_clear()
    W.batch_representatives.cache_clear()
    yield W
    W.load_capture.cache_clear()
    W.batch_representatives.cache_clear()


def test_loader_weights_sum_to_the_workload(tiny_workloads):
    W = tiny_workloads
    hist = W.token_histogram("tiny", "LlamaMLP")
    assert math.isclose(sum(hist.values()), 1.0)
    reps = W.token_representatives(hist, 3)
    assert len(reps) == 3 and math.isclose(sum(w for *_, w in reps), 1.0)
    assert max(n for _, n, _ in reps) == max(n for _, n in hist)  # the largest count is always kept
    assert len({n for _, n, _ in reps}) == 3
    batches = W.batch_representatives("tiny", 4)
    assert len(batches) == 4 and math.isclose(sum(w for *_, w in batches), 1.0)
    for phase, ctx, q, _ in batches:
        assert len(ctx) == len(q) and phase in ("decode", "prefill", "mixed")
        assert (phase == "decode") == all(n == 1 for n in q)


def test_token_cases_share_representatives_across_variants(tiny_workloads):
    from tasks.workload import BANDWIDTH_TOKENS, HAND_PICKED_WEIGHT, token_cases

    variants = {"plain": lambda g: g["args"]["residual"] is None, "fused-add": lambda g: g["args"]["residual"] is not None}
    cases = token_cases("tiny", "full", "RMSNorm", variants)
    captured = [c for v in cases.values() for c in v if c[3] == "captured"]
    assert math.isclose(sum(c[2] for c in captured), 1.0)  # all RMSNorm calls of the model
    assert {c[1] for c in cases["plain"] if c[3] == "captured"} <= {c[1] for c in cases["fused-add"]}
    plain = sum(c[2] for c in cases["plain"] if c[3] == "captured")
    assert math.isclose(plain, 1 / 5)  # 1 of the 5 norms per step (2 layers x 2 + the final one)
    hand = [c for c in cases["plain"] if c[3] == "hand-picked"]
    assert [(c[1], c[2]) for c in hand] == [(t, HAND_PICKED_WEIGHT) for t in BANDWIDTH_TOKENS]
    # no capture, or the CPU profile: hand-picked shapes
    assert {c[3] for c in token_cases("no-such-model", "full", "RMSNorm")[""]} == {"hand-picked"}
    assert {c[3] for c in token_cases("tiny", "cpu", "RMSNorm")[""]} == {"hand-picked"}


def test_state_kernel_calls_split_prefill_and_decode_and_keep_the_heaviest(tmp_path, monkeypatch):
    """A state kernel's captured calls: one per step and phase (a step's prefill chunks together, its
    decodes together), decodes always carrying a state, a one-token prompt a fresh prefill; the
    representatives of each phase keep its heaviest call, and all weights sum to 1."""
    import tasks.workloads as W

    scenarios = [Scenario(name, name, ENGINE, num_requests=n, prompt=LengthDistribution(p, 0.8, 1, 150),
                          output=LengthDistribution(o, 0.8, 1, 20))
                 for name, n, p, o in (("chat", 6, 12, 5), ("long-context", 2, 150, 3), ("batch-1", 1, 9, 8),
                                       ("batch-32", 4, 9, 8), ("long-prefill", 1, 150, 2))]
    config = _tiny_state_config("mamba2-2.7b", 2)
    (tmp_path / "tiny-mamba.json").write_text(json.dumps(capture_model(config, scenarios, model_name="tiny-mamba",
                                                                       layers=None)))
    monkeypatch.setattr(W, "_DIR", tmp_path)
    W.load_capture.cache_clear()
    W.state_call_representatives.cache_clear()
    try:
        data = W.load_capture("tiny-mamba")
        assert set(W.scenario_mix(data)) == set(W.SCENARIO_MIX) | {"long-prefill"}
        assert math.isclose(sum(W.scenario_mix(data).values()), 1.0)
        calls = W._state_calls("tiny-mamba", ("prefill", "decode"))
        assert math.isclose(sum(calls.values()), 1.0)
        assert all(all(carried) and set(lengths) == {1} for phase, lengths, carried in calls if phase == "decode")
        assert all(n > 1 or not c for phase, lengths, carried in calls if phase == "prefill"
                   for n, c in zip(lengths, carried))
        # the chunked scan's task sees only the prefill calls, and they are all its weight
        reps = W.state_call_representatives("tiny-mamba", ("prefill",), 2)
        assert {r[0] for r in reps} == {"prefill"} and len(reps) == 2
        assert math.isclose(sum(r[3] for r in reps), 1.0)
        heaviest = max(sum(lengths) for phase, lengths, _ in calls if phase == "prefill")
        assert max(sum(r[1]) for r in reps) == heaviest
        both = W.state_call_representatives("tiny-mamba", ("prefill", "decode"), 2)
        assert sorted(r[0] for r in both) == ["decode", "decode", "prefill", "prefill"]
        assert math.isclose(sum(r[3] for r in both), 1.0)
    finally:
        W.load_capture.cache_clear()
        W.state_call_representatives.cache_clear()


STATE_CAPTURED = ("mamba2-2.7b", "qwen3-next-80b-a3b")
STATE_FULL_TASKS = ("L1.test_mamba_chunk_scan", "L1.test_selective_state_update", "L1.test_gated_delta_rule",
                    "L1.test_short_convolution", "L1.test_rms_norm_gated", "L2.test_mamba_mixer2",
                    "L2.test_qwen3_next_gated_delta_net", "L2.test_qwen3_next_attention", "L1.test_gemma_rms_norm",
                    "L2.test_qwen3_next_moe_block", "L3.test_mamba2_decoder_layer",
                    "L3.test_qwen3_next_decoder_layer")


def test_committed_state_captures_hold_each_kind_of_layer_and_the_long_prefill():
    from tasks.workloads import load_capture

    for model in STATE_CAPTURED:
        data = load_capture(model)
        assert data is not None, f"run tools/capture_workloads.py --models {model}"
        assert data["capture"]["shape_only"] and "long-prefill" in data["scenarios"]
        total = data["capture"]["num_hidden_layers"]
        batch1 = data["scenarios"]["batch-1"]["modules"]
        steps = next(g for g in batch1 if g["class"] == "VocabParallelEmbedding")["calls"]
        kinds = data["capture"]["layer_kinds"]
        mixer = "MambaMixer2" if model.startswith("mamba2") else "Qwen3NextGatedDeltaNet"
        linear = kinds.get("linear_attention", total)
        assert sum(g["calls"] for g in batch1 if g["class"] == mixer) == linear * steps
        assert sum(g["calls"] for g in batch1 if g["class"] == "Attention") == kinds.get("full_attention", 0) * steps
        # the 64k-token prompts arrive in 8192-token chunks that carry their states
        chunks = [s for s in data["scenarios"]["long-prefill"]["attention_steps"] if s["prefill"]]
        assert any(c > 0 and q == 8192 for s in chunks for c, q in s["prefill"])


@pytest.mark.parametrize("module", STATE_FULL_TASKS)
def test_state_model_full_profiles_draw_from_the_captures(module):
    import importlib

    task = importlib.import_module(f"tasks.{module}").TASK
    cases = task.cases("full")
    assert len({c.id for c in cases}) == len(cases)
    for model in {c.model for c in cases} & set(STATE_CAPTURED):
        mine = [c for c in cases if c.model == model]
        captured = [c for c in mine if c.params.get("source") == "captured"]
        assert captured, f"{task.name}: no captured case for {model}"
        assert math.isclose(sum(c.weight for c in captured), 1.0, rel_tol=1e-6), task.name
        assert sum(c.weight for c in mine) < 1.1  # hand-picked cases kept beside them barely count


def test_a_hybrid_layer_task_weights_each_layer_kind_by_its_share_of_the_layers():
    """Qwen3-Next's decoder-layer task runs both kinds on the same captured steps; a linear-attention
    case stands for 36 layers and a full-attention one for 12, so the linear cases carry three
    quarters of the captured weight, step by step."""
    from tasks.L3.test_qwen3_next_decoder_layer import TASK

    captured = [c for c in TASK.cases("full") if c.params.get("source") == "captured"]
    by_kind = {kind: {c.id.replace(f"-{kind}-", "-"): c.weight for c in captured if c["layer_type"] == kind}
               for kind in ("linear", "full")}
    assert by_kind["linear"].keys() == by_kind["full"].keys() and len(by_kind["full"]) >= 4
    for step, weight in by_kind["full"].items():
        assert math.isclose(by_kind["linear"][step], 3 * weight), step
    assert math.isclose(sum(by_kind["linear"].values()), 0.75)


def test_committed_captures_drive_the_full_profile():
    """Every Llama-family model has a committed capture and the full-profile cases come from it."""
    from tasks.workload import LLAMA_FAMILY
    from tasks.workloads import captured_models, load_capture

    missing = set(LLAMA_FAMILY) - set(captured_models())
    assert not missing, f"run tools/capture_workloads.py: no capture for {sorted(missing)}"
    for model in LLAMA_FAMILY:
        data = load_capture(model)
        assert data["capture"]["shape_only"] and data["scenarios"]["chat"]["steps"] > 100


MOE_CAPTURED = ("mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v2-lite")
# Tasks whose full profile must come from those captures: per model, the captured cases' weights sum
# to 1 (call or step shares; the L4 tasks keep their most frequent steps, reweighted).
MOE_FULL_TASKS = ("L1.test_fused_moe", "L1.test_topk_softmax", "L2.test_mixtral_moe", "L2.test_deepseek_v2_moe",
                  "L1.test_mla_attention", "L2.test_deepseek_v2_attention", "L3.test_mixtral_decoder_layer",
                  "L3.test_deepseek_v2_decoder_layer", "L4.test_deepseek_v2_for_causal_lm",
                  "L4.test_qwen3_moe_for_causal_lm")


def test_committed_moe_captures_are_shape_only_and_route():
    """The MoE models' captures ran the meta-safe MoE and MLA modules: routing, experts and the
    latent attention were recorded, at the real depth's call counts."""
    from tasks.workloads import load_capture

    for model in MOE_CAPTURED:
        data = load_capture(model)
        assert data is not None, f"run tools/capture_workloads.py --models {model}"
        assert data["capture"]["shape_only"] and data["scenarios"]["chat"]["steps"] > 100
        classes = {g["class"] for g in data["scenarios"]["chat"]["modules"]}
        assert {"FusedMoE", "TopKSoftmax"} <= classes
        assert ("MLAAttention" in classes) == (model == "deepseek-v2-lite")
        total = data["capture"]["num_hidden_layers"]
        moe_layers = total - 1 if model == "deepseek-v2-lite" else total  # DeepSeek's layer 0 is dense
        moe = next(g for g in data["scenarios"]["batch-1"]["modules"] if g["class"] == "FusedMoE")
        embed = next(g for g in data["scenarios"]["batch-1"]["modules"] if g["class"] == "VocabParallelEmbedding")
        assert moe["calls"] == moe_layers * embed["calls"]  # one call per MoE layer per step


@pytest.mark.parametrize("module", MOE_FULL_TASKS)
def test_moe_and_mla_full_profiles_draw_from_the_captures(module):
    import importlib

    task = importlib.import_module(f"tasks.{module}").TASK
    cases = task.cases("full")
    for model in {c.model for c in cases}:
        mine = [c for c in cases if c.model == model]
        captured = [c for c in mine if c.params.get("source") == "captured"]
        assert captured, f"{task.name}: no captured case for {model}"
        assert math.isclose(sum(c.weight for c in captured), 1.0, rel_tol=1e-6), task.name
