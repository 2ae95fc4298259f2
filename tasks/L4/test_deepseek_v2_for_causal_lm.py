"""DeepseekV2ForCausalLM (L4): token ids and positions in, final hidden states out, over the paged
latent cache, ``LAYERS`` deep as the real model begins: layer 0 dense, layer 1 MoE.

CPU profile: the cut config of ``tasks/mla.py`` (real E = 64, k = 6, 2 shared experts; MLA at 4
heads and a 64-wide latent) with the vocabulary sharded by 64; full profile: the real widths and
vocabulary, the most frequent decode and prefill steps of the captured DeepSeek-V2-Lite workload.

Routing-aware correctness: only layer 1 routes, and it is the last layer (its K/V rows are stored
before its MoE block, and the final norm is per token), so an undetermined token changes only its
own output row: the token rule applies, at the L4 tolerance (two layers of rounding reach the gate).
Scored in float32 (``float32_cases``, as the other MoE models): at the real width the bf16
reference's own deviation left every token of four draws undetermined on the H200.
"""
from fk_pytest import standard_tests
from kernels_reference.L4.deepseek_v2 import DeepseekV2ForCausalLM

from ..mla import DeepseekLayerTask, MLAPagedTask
from ..moe import L4_ROUTING_ULPS, float32_cases, token_rule
from .test_llama_for_causal_lm import LAYERS, LlamaModelTask


class DeepseekV2ModelTask(DeepseekLayerTask, MLAPagedTask, LlamaModelTask):
    name = "deepseek_v2_for_causal_lm"
    level = 4
    family = "model"
    module_path = "L4/deepseek_v2.py"
    reference = DeepseekV2ForCausalLM
    depth = LAYERS
    undetermined_rows = token_rule(("hidden_states",), ulps=L4_ROUTING_ULPS)
    fuzz_dtypes = ("fp32",)  # see float32_cases

    def cases(self, profile):
        shard = 64 if profile == "cpu" else 1
        return float32_cases(self.model_cases(
            profile, lambda model: dict(self.case_params(model, profile), vocab_shard=shard)))


TASK = DeepseekV2ModelTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
