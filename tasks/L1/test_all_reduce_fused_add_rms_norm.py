"""The all-reduce fused with the residual add and RMSNorm (``AllReduceFusedAddRMSNorm``: what
serving stacks run after a row-parallel layer at decode): the partial sums reduced, the residual
added, the sum normalised; both the normalised output and the new residual are scored, on every
rank. Degrees 2 and 4 on the CPU (:mod:`fk_pytest.tp_eval`); the degree-1 case is the plain fused
add + RMSNorm.
"""
import torch

from fk_pytest import standard_tests
from kernels_reference.L1.all_reduce import AllReduceFusedAddRMSNorm

from ..all_reduce_inputs import AllReduceTask
from ..configs import load_config
from ..workload import activations


class AllReduceFusedAddRMSNormTask(AllReduceTask):
    name = "all_reduce_fused_add_rms_norm"
    reference = AllReduceFusedAddRMSNorm

    def init_args(self, case):
        eps = load_config(case.model).get("rms_norm_eps", 1e-6) if case.model else 1e-6
        return {"hidden_size": case["hidden"], "eps": eps}

    def init_weights(self, module, gen):
        with torch.no_grad():  # a trained norm's gains: around 1, a few channels far from it
            module.weight.copy_(1.0 + 0.3 * torch.randn(module.weight.shape, generator=gen))

    def output_names(self, case):
        return ("out", "residual")

    def make_inputs(self, case, gen, device):
        inputs = super().make_inputs(case, gen, device)
        inputs["residual"] = activations((case["tokens"], case["hidden"]), gen, device, case.dtype, scale=4.0)
        return inputs

    def io_bytes(self, case):
        return 4 * case["tokens"] * case["hidden"] * torch.finfo(case.dtype).bits // 8


TASK = AllReduceFusedAddRMSNormTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
