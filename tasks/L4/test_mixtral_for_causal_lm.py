"""MixtralForCausalLM (L4): token ids and positions in, final hidden states out, over the paged
cache, ``LAYERS`` deep (as the Llama L4 task).

CPU profile: Mixtral's E = 8, k = 2 at the cut widths of ``tasks/moe.py`` with the vocabulary
sharded by 64; full profile: the real widths and vocabulary, the most frequent captured decode and
prefill steps (``LlamaModelTask.model_cases``). Routing-aware correctness across layers (``tasks/moe.py`` model_rule),
scored in float32 (``float32_cases``: in bf16 most tokens' routing is undetermined after two layers).
"""
from fk_pytest import standard_tests
from kernels_reference.L4.mixtral import MixtralForCausalLM

from ..moe import MoELayerTask, float32_cases, model_rule
from .test_llama_for_causal_lm import LAYERS, LlamaModelTask


class MixtralModelTask(MoELayerTask, LlamaModelTask):
    name = "mixtral_for_causal_lm"
    module_path = "L4/mixtral.py"
    reference = MixtralForCausalLM
    models = {"cpu": ("mixtral-8x7b",), "full": ("mixtral-8x7b",)}
    depth = LAYERS
    undetermined_rows = model_rule
    fuzz_dtypes = ("fp32",)  # see float32_cases

    def cases(self, profile):
        shard = 64 if profile == "cpu" else 1
        return float32_cases(self.model_cases(profile, lambda model: {"vocab_shard": shard, "profile": profile}))


TASK = MixtralModelTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
