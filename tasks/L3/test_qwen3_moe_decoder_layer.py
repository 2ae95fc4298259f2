"""Qwen3MoeDecoderLayer (L3): Qwen3 attention (per-head q/k norm) over the paged cache + the
128-expert MoE block.

CPU profile: Qwen3-30B-A3B's E = 128, k = 8 at hidden 256, 8 heads of 32, expert
width 64 (``tasks/moe.py`` cut_config); full profile: the real config on the captured steps. Routing-aware correctness:
tokens whose 8th and 9th router logits are within rounding leave their output row out.
"""
from fk_pytest import standard_tests
from kernels_reference.L3.qwen3_moe_decoder_layer import Qwen3MoeDecoderLayer

from ..moe import MoELayerTask, token_rule
from ..L3.test_llama_decoder_layer import DecoderLayerTask


class Qwen3MoeDecoderLayerTask(MoELayerTask, DecoderLayerTask):
    name = "qwen3_moe_decoder_layer"
    module_path = "L3/qwen3_moe_decoder_layer.py"
    reference = Qwen3MoeDecoderLayer
    models = {"cpu": ("qwen3-30b-a3b",), "full": ("qwen3-30b-a3b",)}
    undetermined_rows = token_rule(("hidden_states",))

    def cases(self, profile):
        return self.captured_batch_cases(profile, lambda model: {"profile": profile})

    def init_args(self, case):
        return {"config": self.config(case), "layer_idx": 0}


TASK = Qwen3MoeDecoderLayerTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
