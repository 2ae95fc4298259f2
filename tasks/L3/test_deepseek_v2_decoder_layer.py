"""DeepseekV2DecoderLayer (L3): multi-head latent attention over the paged latent cache, then the
MoE block (64 routed experts, top-6 unnormalised, 2 shared experts) of DeepSeek-V2-Lite's layers 1..26,
the residual add fused into the two norms.

CPU profile: the real E = 64, k = 6 and shared experts at hidden 256 with MLA cut to 4 heads
(``tasks/mla.py`` deepseek_arch_config); full profile: the real config and the steps of the
captured DeepSeek-V2-Lite workload. Routing-aware correctness: a token whose 6th and 7th router
logits are within rounding leaves its output row out (the MoE block is the layer's last step).
"""
from fk_pytest import standard_tests
from kernels_reference.L3.deepseek_v2_decoder_layer import DeepseekV2DecoderLayer

from ..L3.test_llama_decoder_layer import DecoderLayerTask
from ..mla import MOE_LAYER, DeepseekLayerTask, MLAPagedTask
from ..moe import token_rule


class DeepseekV2DecoderLayerTask(DeepseekLayerTask, MLAPagedTask, DecoderLayerTask):
    name = "deepseek_v2_decoder_layer"
    level = 3
    family = "layer"
    module_path = "L3/deepseek_v2_decoder_layer.py"
    reference = DeepseekV2DecoderLayer
    undetermined_rows = token_rule(("hidden_states",))

    def layer_indices(self):
        return (MOE_LAYER,)

    def cases(self, profile):
        return self.captured_batch_cases(profile, lambda model: self.case_params(model, profile))

    def init_args(self, case):
        return {"config": self.config(case), "layer_idx": MOE_LAYER}


TASK = DeepseekV2DecoderLayerTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
