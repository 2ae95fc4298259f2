"""RowParallelLinear: the MLP's down projection (the widest GEMM input of the layer)."""
from fk_pytest import standard_tests
from kernels_reference.L1.linear import RowParallelLinear

from ..dense import DenseTask


class DownProjTask(DenseTask):
    name = "row_parallel_linear"
    module_path = "L1/linear.py"
    reference = RowParallelLinear

    def shape(self, cfg):
        return dict(input_size=cfg["intermediate_size"], output_size=cfg["hidden_size"], bias=False), \
            cfg["intermediate_size"], cfg["hidden_size"]


TASK = DownProjTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
