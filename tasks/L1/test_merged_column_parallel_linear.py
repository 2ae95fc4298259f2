"""MergedColumnParallelLinear: the fused gate/up projection of the MLP."""
from fk_pytest import standard_tests
from kernels_reference.L1.linear import MergedColumnParallelLinear

from ..dense import DenseTask


class GateUpTask(DenseTask):
    name = "merged_column_parallel_linear"
    module_path = "L1/linear.py"
    reference = MergedColumnParallelLinear

    def shape(self, cfg):
        inter = cfg["intermediate_size"]
        return dict(input_size=cfg["hidden_size"], output_sizes=[inter, inter], bias=False), \
            cfg["hidden_size"], 2 * inter


TASK = GateUpTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
