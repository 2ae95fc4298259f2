"""LlamaDecoderLayer (L3): a whole layer with the residual add fused into its two norms."""
from fk_pytest import standard_tests
from kernels_reference.L3.llama_decoder_layer import LlamaDecoderLayer

from ..dense import DenseTask
from ..paged import PagedTask, arch_config
from ..workload import activations


class DecoderLayerTask(PagedTask):
    name = "llama_decoder_layer"
    level = 3
    family = "layer"
    module_path = "L3/llama_decoder_layer.py"
    reference = LlamaDecoderLayer
    init_weights = DenseTask.init_weights

    tp_degrees = (2,)  # on the CPU: attention heads, KV cache and MLP split over two gloo ranks

    def cases(self, profile):
        return self.with_tp_cases(self.captured_batch_cases(profile, lambda model: {}), profile)

    def config(self, case):
        return arch_config(case["model"])

    def init_args(self, case):
        return {"config": self.config(case)}

    def make_inputs(self, case, gen, device):
        inputs = self.metadata_and_caches(case, gen, device)
        hidden, t = self.config(case).hidden_size, sum(case["query"])
        inputs["positions"] = inputs["metadata"].positions()
        inputs["hidden_states"] = activations((t, hidden), gen, device, case.dtype)
        inputs["residual"] = activations((t, hidden), gen, device, case.dtype, scale=4.0)
        return inputs

    def output_names(self, case):
        return ("hidden_states", "residual")

    def mutable_inputs(self, case):
        return super().mutable_inputs(case) + ("hidden_states", "residual")

    def io_bytes(self, case):
        c = self.config(case)
        attn_w = c.hidden_size * (2 * c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim
        return self.attention_io(case) + (attn_w + 3 * c.hidden_size * c.intermediate_size) * 2

    def flops(self, case):
        c = self.config(case)
        t = sum(case["query"])
        attn_w = c.hidden_size * (2 * c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim
        return self.attention_flops(case) + 2 * t * (attn_w + 3 * c.hidden_size * c.intermediate_size)


TASK = DecoderLayerTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
