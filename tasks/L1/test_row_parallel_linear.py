"""RowParallelLinear: the MLP's down projection (the widest GEMM input of the layer).

On the CPU profile the first model's prefill case also runs at tensor-parallel degrees 2 and 4
(``tp`` param; gloo ranks, :mod:`fk_pytest.tp_eval`): each rank holds its slice of the input
features and of the weight's columns, computes a partial product and all-reduces it, so every rank
must hold the whole output. Degrees above 1 need one device per rank on a GPU and are not in the
full profile yet (no multi-GPU machine is lent).
"""
from fk_pytest import standard_tests
from kernels_reference.L1.linear import RowParallelLinear

from ..dense import DenseTask


class DownProjTask(DenseTask):
    name = "row_parallel_linear"
    module_path = "L1/linear.py"
    reference = RowParallelLinear
    tp_degrees = (2, 4)

    def shape(self, cfg):
        return dict(input_size=cfg["intermediate_size"], output_size=cfg["hidden_size"], bias=False), \
            cfg["intermediate_size"], cfg["hidden_size"]

    def rank_inputs(self, inputs, case, rank, tp):
        """A row-parallel layer's input arrives sharded (``input_is_parallel``): this rank's columns."""
        x = inputs[self.input_name]
        width = x.shape[-1] // tp
        return dict(inputs, **{self.input_name: x[..., rank * width:(rank + 1) * width]})


TASK = DownProjTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
