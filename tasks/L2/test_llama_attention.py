"""LlamaAttention (L2): qkv projection, q/k norm (Qwen3), RoPE, paged attention, o_proj."""
from fk_pytest import standard_tests
from kernels_reference.L2.llama_attention import LlamaAttention

from ..dense import DenseTask
from ..paged import PagedTask, arch_config
from ..workload import activations


class LlamaAttentionTask(PagedTask):
    name = "llama_attention"
    level = 2
    module_path = "L2/llama_attention.py"
    reference = LlamaAttention
    init_weights = DenseTask.init_weights

    # No tensor-parallel case of its own on the CPU profile (the main job has no time left): the
    # decoder layer's TP case runs this attention at TP 2, and tests/test_tensor_parallel.py runs it
    # at TP 4 with replicated KV heads and without its all-reduce.

    def cases(self, profile):
        return self.with_tp_cases(self.captured_batch_cases(profile, lambda model: {}), profile)

    def init_args(self, case):
        c = arch_config(case["model"])
        return dict(hidden_size=c.hidden_size, num_heads=c.num_attention_heads,
                    num_kv_heads=c.num_key_value_heads, head_dim=c.head_dim,
                    max_position_embeddings=c.max_position_embeddings, rope_theta=c.rope_theta,
                    rope_scaling=c.rope_scaling, rms_norm_eps=c.rms_norm_eps, qkv_bias=c.qkv_bias,
                    qk_norm=c.qk_norm)

    def make_inputs(self, case, gen, device):
        inputs = self.metadata_and_caches(case, gen, device)
        hidden = arch_config(case["model"]).hidden_size
        inputs["positions"] = inputs["metadata"].positions()
        inputs["hidden_states"] = activations((sum(case["query"]), hidden), gen, device, case.dtype)
        return inputs

    def io_bytes(self, case):
        c = arch_config(case["model"])
        weights = c.hidden_size * (c.num_attention_heads * 2 + c.num_key_value_heads * 2) * c.head_dim * 2
        return self.attention_io(case) + weights

    def flops(self, case):
        c = arch_config(case["model"])
        t = sum(case["query"])
        return self.attention_flops(case) + 2 * t * c.hidden_size * (2 * c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim


TASK = LlamaAttentionTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
