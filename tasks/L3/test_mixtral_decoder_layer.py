"""MixtralDecoderLayer (L3): Llama attention over the paged cache + the 8-expert MoE block.

CPU profile: Mixtral's E = 8, k = 2 and its GQA ratio at hidden 256, 8 heads of 32, expert
width 64 (``tasks/moe.py`` cut_config), and its first decode batch again at tensor-parallel degree
2; full profile: the real config on the captured steps. Routing-aware correctness:
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

    # On the CPU also at degree 2 (gloo ranks): attention heads and KV heads split, each rank every
    # expert's slice of the intermediate features, the expert outputs all-reduced (vLLM's sharding).
    tp_degrees = (2,)

    def cases(self, profile):
        return self.with_tp_cases(self.captured_batch_cases(profile, lambda model: {"profile": profile}), profile)


TASK = MixtralDecoderLayerTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
