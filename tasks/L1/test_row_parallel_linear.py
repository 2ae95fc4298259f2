"""RowParallelLinear: the MLP's down projection (the widest GEMM input of the layer).

On the CPU profile the first model's prefill case also runs at tensor-parallel degrees 2 and 4
(``tp`` param; gloo ranks, :mod:`fk_pytest.tp_eval`): each rank holds its slice of the input
features and of the weight's columns, computes a partial product and all-reduces it, so every rank
must hold the whole output. Degrees above 1 need one device per rank on a GPU and are not in the
full profile yet (no multi-GPU machine is lent).
"""
from fk_pytest import Case, standard_tests
from kernels_reference.L1.linear import RowParallelLinear

from ..dense import DenseTask

CPU_TP_DEGREES = (2, 4)


class DownProjTask(DenseTask):
    name = "row_parallel_linear"
    module_path = "L1/linear.py"
    reference = RowParallelLinear

    def shape(self, cfg):
        return dict(input_size=cfg["intermediate_size"], output_size=cfg["hidden_size"], bias=False), \
            cfg["intermediate_size"], cfg["hidden_size"]

    def cases(self, profile):
        out = super().cases(profile)
        if profile != "cpu":
            return out
        base = next(c for c in out if "prefill" in c.id)
        return out + [Case(f"{base.id}-tp{tp}", base.dtype, model=base.model, weight=base.weight,
                           params=dict(base.params, tp=tp)) for tp in CPU_TP_DEGREES]

    def rank_inputs(self, inputs, case, rank, tp):
        """A row-parallel layer's input arrives sharded (``input_is_parallel``): this rank's columns."""
        x = inputs[self.input_name]
        width = x.shape[-1] // tp
        return dict(inputs, **{self.input_name: x[..., rank * width:(rank + 1) * width]})


TASK = DownProjTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
