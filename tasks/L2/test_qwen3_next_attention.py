"""Qwen3NextAttention (L2): Qwen3-Next's gated full-attention block (qkv + gate projection,
zero-centred q/k norms, partial RoPE, paged attention, sigmoid output gate, o_proj).

Batches are the paged attention tasks' (decode steps at mixed contexts, chunked and varlen
prefill). The CPU profile keeps Qwen3-Next's hidden size, head_dim 256, rotary 64 and
query-per-KV-head ratio but fewer heads (the interpreter runs the attention kernel per head).
"""
from fk_pytest import standard_tests
from kernels_reference.L2.qwen3_next_attention import Qwen3NextAttention

from ..configs import load_config
from ..dense import DenseTask
from ..linear_inputs import GATED_DELTA_MODELS, zero_centred_norm_weights
from ..paged import PagedTask
from ..workload import activations

CPU_HEADS = (8, 1)  # (query heads, KV heads): Qwen3-Next's 8 query heads per KV head


class Qwen3NextAttentionTask(PagedTask):
    name = "qwen3_next_attention"
    level = 2
    module_path = "L2/qwen3_next_attention.py"
    reference = Qwen3NextAttention
    models = {"cpu": GATED_DELTA_MODELS, "full": GATED_DELTA_MODELS}

    def cases(self, profile):
        return self.captured_batch_cases(profile, lambda model: {"profile": profile})

    def heads(self, case):
        cfg = load_config(case["model"])
        nq, nk = CPU_HEADS if case.params.get("profile") == "cpu" else (cfg["num_attention_heads"],
                                                                         cfg["num_key_value_heads"])
        return nq, nk, cfg["head_dim"]

    def init_args(self, case):
        cfg = load_config(case["model"])
        nq, nk, hd = self.heads(case)
        return dict(hidden_size=cfg["hidden_size"], num_heads=nq, num_kv_heads=nk, head_dim=hd,
                    max_position_embeddings=cfg["max_position_embeddings"], rope_theta=cfg["rope_theta"],
                    partial_rotary_factor=cfg["partial_rotary_factor"], rms_norm_eps=cfg["rms_norm_eps"],
                    attention_bias=cfg.get("attention_bias", False))

    def init_weights(self, module, gen):
        DenseTask.init_weights(self, module, gen)
        zero_centred_norm_weights(module, gen)

    def make_inputs(self, case, gen, device):
        inputs = self.metadata_and_caches(case, gen, device)
        hidden = load_config(case["model"])["hidden_size"]
        inputs["positions"] = inputs["metadata"].positions()
        inputs["hidden_states"] = activations((sum(case["query"]), hidden), gen, device, case.dtype)
        return inputs

    def io_bytes(self, case):
        cfg = load_config(case["model"])
        nq, nk, hd = self.heads(case)
        weights = cfg["hidden_size"] * (3 * nq + 2 * nk) * hd * 2
        return self.attention_io(case) + weights

    def flops(self, case):
        cfg = load_config(case["model"])
        nq, nk, hd = self.heads(case)
        t = sum(case["query"])
        return self.attention_flops(case) + 2 * t * cfg["hidden_size"] * (3 * nq + 2 * nk) * hd


TASK = Qwen3NextAttentionTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
