"""MixtralMoE (L2): router GEMM + 8 experts, top-2 renormalised (Mixtral-8x7B).

CPU profile: Mixtral's E = 8 and k = 2 at hidden 256 and expert width 64 (``tasks/moe.py``
CPU_CUT); full profile: the real widths (hidden 4096, experts 14336). Tokens whose 2nd and 3rd
router logits are within bf16 rounding are left out of the comparison (routing-aware correctness).
"""
from fk_pytest import standard_tests
from kernels_reference.L2.mixtral_moe import MixtralMoE

from ..moe import MoEBlockTask


class MixtralMoETask(MoEBlockTask):
    name = "mixtral_moe"
    module_path = "L2/mixtral_moe.py"
    reference = MixtralMoE
    models = ("mixtral-8x7b",)

    def block_args(self, cfg):
        return dict(num_experts=cfg["num_local_experts"], top_k=cfg["num_experts_per_tok"],
                    hidden_size=cfg["hidden_size"], intermediate_size=cfg["intermediate_size"])

    def expert_widths(self, init):
        return init["num_experts"], init["top_k"], init["intermediate_size"], 0


TASK = MixtralMoETask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
