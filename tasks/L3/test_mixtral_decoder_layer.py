"""MixtralDecoderLayer (L3): Llama attention over the paged cache + the 8-expert MoE block.

CPU profile: Mixtral's E = 8, k = 2 and its GQA ratio at hidden 256, 8 heads of 32, expert
width 64 (``tasks/moe.py`` cut_config); full profile: the real config on the captured steps. Routing-aware correctness:
tokens whose 2nd and 3rd router logits are within rounding leave their output row out.
"""
from fk_pytest import standard_tests
from kernels_reference.L3.mixtral_decoder_layer import MixtralDecoderLayer

from ..moe import MoELayerTask, token_rule
from ..L3.test_llama_decoder_layer import DecoderLayerTask


class MixtralDecoderLayerTask(MoELayerTask, DecoderLayerTask):
    name = "mixtral_decoder_layer"
    module_path = "L3/mixtral_decoder_layer.py"
    reference = MixtralDecoderLayer
    models = {"cpu": ("mixtral-8x7b",), "full": ("mixtral-8x7b",)}
    undetermined_rows = token_rule(("hidden_states",))

    # No TP case in the README's main job (6 s of it, over its 3-minute budget): the layer's first
    # decode batch at degree 2 (heads, KV heads and every expert's slice split, the expert outputs
    # all-reduced) is checked in tests/test_tensor_parallel.py with a copy of the reference and
    # with an expert block that skips its all-reduce, and end to end in the main job's Mixtral
    # case at TP 2 (tasks/e2e.py TP_CASES).

    def cases(self, profile):
        return self.captured_batch_cases(profile, lambda model: {"profile": profile})


TASK = MixtralDecoderLayerTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
