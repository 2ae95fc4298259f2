"""BertLayer (L3): a whole post-norm encoder layer, BertAttention then the GELU MLP with its own add &
norm, over the same packed batches as the attention block (all-MiniLM-L6-v2, BGE-M3)."""
from fk_pytest import standard_tests
from kernels_reference.L3.bert_layer import BertLayer

from ..L2.test_bert_attention import EncoderBlockTask, bert_config


class BertLayerTask(EncoderBlockTask):
    name = "bert_layer"
    level = 3
    family = "layer"
    module_path = "L3/bert_layer.py"
    reference = BertLayer
    fuzz_dtypes = ("bf16",)  # the attention block sweeps float32; the layer adds no float32-only path

    def fp32_batches(self, profile):
        return super().fp32_batches(profile) if profile == "full" else {}  # CPU: the attention block's sweep

    def init_args(self, case):
        return {"config": bert_config(case.model)}

    def make_inputs(self, case, gen, device):
        return self.hidden_inputs(case, gen, device)

    def layer_weights(self, case) -> int:
        c = bert_config(case.model)
        return 4 * c.hidden_size ** 2 + 2 * c.hidden_size * c.intermediate_size

    def io_bytes(self, case):
        t, h = sum(case["lengths"]), bert_config(case.model).hidden_size
        return (self.layer_weights(case) + 2 * t * h) * self.element_bytes(case)

    def flops(self, case):
        return 2 * sum(case["lengths"]) * self.layer_weights(case) + self.attention_flops(case)


TASK = BertLayerTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
