"""MergedColumnParallelLinear: the fused gate/up projection of the MLP.

Also at tensor-parallel degrees 2 and 4 on the CPU profile (:mod:`fk_pytest.tp_eval`): rank r holds
its rows of the gate and of the up matrix, [gate_r | up_r], and the ranks' outputs are put back in
the single-GPU layout, [gate_0 .. gate_n | up_0 .. up_n], to be judged.
"""
import torch

from fk_pytest import standard_tests
from kernels_reference.L1.linear import MergedColumnParallelLinear

from ..dense import DenseTask


class GateUpTask(DenseTask):
    name = "merged_column_parallel_linear"
    module_path = "L1/linear.py"
    reference = MergedColumnParallelLinear
    tp_degrees = (2, 4)

    def shape(self, cfg):
        inter = cfg["intermediate_size"]
        return dict(input_size=cfg["hidden_size"], output_sizes=[inter, inter], bias=False), \
            cfg["hidden_size"], 2 * inter

    def assemble_ranks(self, outputs, case):
        sizes = [n // len(outputs) for n in case["init"]["output_sizes"]]
        pieces = [out[0].split(sizes, dim=-1) for out in outputs]  # per rank: (gate_r, up_r)
        return [torch.cat([p[i] for i in range(len(sizes)) for p in pieces], dim=-1)]


TASK = GateUpTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
