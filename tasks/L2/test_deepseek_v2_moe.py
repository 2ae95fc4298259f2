"""DeepseekV2MoE (L2): router GEMM + 64 routed experts (top-6, not renormalised) + 2 shared
experts (DeepSeek-V2-Lite's MoE layers; its MLA attention is not part of this block).

CPU profile: the real E = 64, k = 6 and 2 shared experts at hidden 256 and expert width 64
(``tasks/moe.py`` CPU_CUT); full profile: the real widths (hidden 2048, experts 1408).
"""
from fk_pytest import standard_tests
from kernels_reference.L2.deepseek_v2_moe import DeepseekV2MoE
from kernels_reference.model_config import DeepseekMoEConfig

from ..moe import MoEBlockTask


class DeepseekV2MoETask(MoEBlockTask):
    name = "deepseek_v2_moe"
    module_path = "L2/deepseek_v2_moe.py"
    reference = DeepseekV2MoE
    models = ("deepseek-v2-lite",)

    def block_args(self, cfg):
        return DeepseekMoEConfig.from_hf(cfg).block_args()

    def expert_widths(self, init):
        return (init["n_routed_experts"], init["num_experts_per_tok"], init["moe_intermediate_size"],
                init["n_shared_experts"] * init["moe_intermediate_size"])


TASK = DeepseekV2MoETask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
