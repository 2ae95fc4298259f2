"""Qwen3MoeForCausalLM (L4): token ids and positions in, final hidden states out, over the paged
cache, ``LAYERS`` deep (as the Llama L4 task).

CPU profile: Qwen3-30B-A3B's E = 128, k = 8 at the cut widths of ``tasks/moe.py``
with the vocabulary sharded by 64 (both profiles: layer 0 dense,
see moe_arch_config); full profile: the real widths and vocabulary, the most frequent captured decode and
prefill steps (``LlamaModelTask.model_cases``). Routing-aware correctness across layers (``tasks/moe.py``
model_rule), scored in float32 (``float32_cases``: in bf16 most tokens' routing is undetermined after two layers).
"""
from fk_pytest import standard_tests
from kernels_reference.L4.qwen3_moe import Qwen3MoeForCausalLM

from ..moe import MoELayerTask, float32_cases, model_rule
from .test_llama_for_causal_lm import LAYERS, LlamaModelTask


class Qwen3MoeModelTask(MoELayerTask, LlamaModelTask):
    name = "qwen3_moe_for_causal_lm"
    module_path = "L4/qwen3_moe.py"
    reference = Qwen3MoeForCausalLM
    models = {"cpu": ("qwen3-30b-a3b",), "full": ("qwen3-30b-a3b",)}
    depth = LAYERS
    undetermined_rows = model_rule
    fuzz_dtypes = ("fp32",)  # see float32_cases

    def cases(self, profile):
        shard = 64 if profile == "cpu" else 1
        return float32_cases(self.model_cases(profile, lambda model: {"vocab_shard": shard, "profile": profile}))


TASK = Qwen3MoeModelTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
