"""LlamaForCausalLM (L4) for Llama-3.1-8B, Qwen3-8B, Mistral-7B-v0.3, Qwen2.5-7B (CPU: Qwen3-0.6B,
Qwen2.5-0.5B): token ids and positions in, final hidden states out, over the paged cache.

Depth is truncated to ``LAYERS`` layers (every layer is the same code; the whole-depth model is
scored end to end by the engine tasks); the CPU profile also shards the vocabulary by 64. Full
profile: the most frequent decode and prefill steps of each model's captured workload.
"""
import dataclasses

from fk_pytest import standard_tests
from kernels_reference.L4.llama import LlamaForCausalLM

from ..dense import DenseTask
from ..paged import PagedTask, arch_config

LAYERS = 2
# Per model, the most frequent captured decode steps and prefill/mixed steps (a 2-layer 8B case is
# heavy; decode dominates the step counts, prefill the time, so both phases are kept).
CAPTURED_STEPS = {"decode": 2, "prefill": 1}


class LlamaModelTask(PagedTask):
    name = "llama_for_causal_lm"
    level = 4
    family = "model"
    module_path = "L4/llama.py"
    reference = LlamaForCausalLM
    layers = LAYERS
    # No tensor-parallel case on the CPU profile: the main job had no time left for it (3.5 s); the
    # whole model at TP 2 runs in tests/test_engine_tp.py, and its layer in llama_decoder_layer's.
    init_weights = DenseTask.init_weights
    models = {"cpu": ("qwen3-0.6b", "qwen2.5-0.5b"),
              "full": ("llama-3.1-8b", "qwen3-8b", "mistral-7b-v0.3", "qwen2.5-7b")}

    def cases(self, profile):
        shard = 64 if profile == "cpu" else 1
        return self.model_cases(profile, lambda model: {"vocab_shard": shard})

    def model_cases(self, profile, params_for):
        """The captured steps (full profile) trimmed to each model's ``CAPTURED_STEPS`` most
        frequent decode and prefill steps, reweighted to sum to 1 per model."""
        cases = self.captured_batch_cases(profile, params_for)
        if profile == "cpu":
            return cases
        out = []
        for model in self.models[profile]:
            mine = sorted((c for c in cases if c.model == model and c.params.get("source") == "captured"),
                          key=lambda c: -c.weight)
            decode = [c for c in mine if all(q == 1 for q in c["query"])]
            prefill = [c for c in mine if c not in decode]
            captured = decode[:CAPTURED_STEPS["decode"]] + prefill[:CAPTURED_STEPS["prefill"]]
            total = sum(c.weight for c in captured) or 1.0
            out += [dataclasses.replace(c, weight=c.weight / total) for c in captured]
        return out

    def config(self, case):
        return arch_config(case["model"], LAYERS, case["vocab_shard"])

    def init_args(self, case):
        return {"config": self.config(case)}

    def make_inputs(self, case, gen, device):
        import torch

        inputs = self.metadata_and_caches(case, gen, device)
        vocab = self.config(case).vocab_size
        inputs["positions"] = inputs["metadata"].positions()
        inputs["input_ids"] = torch.randint(0, vocab, (sum(case["query"]),), generator=gen, device=device)
        return inputs

    def output_names(self, case):
        return ("hidden_states",)

    def io_bytes(self, case):
        c = self.config(case)
        attn_w = c.hidden_size * (2 * c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim
        return self.attention_io(case) + LAYERS * (attn_w + 3 * c.hidden_size * c.intermediate_size) * 2

    def flops(self, case):
        c = self.config(case)
        t = sum(case["query"])
        attn_w = c.hidden_size * (2 * c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim
        return self.attention_flops(case) + 2 * t * LAYERS * (attn_w + 3 * c.hidden_size * c.intermediate_size)


TASK = LlamaModelTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
