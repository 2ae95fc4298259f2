"""The tensor-parallel all-reduce (``TensorParallelAllReduce``, vLLM's
``tensor_model_parallel_all_reduce``): every rank's partial activation summed, the sum on every
rank. Scored at degrees 2 and 4 on the CPU (gloo ranks, :mod:`fk_pytest.tp_eval`); a candidate
replaces the communication itself (one-shot / two-shot over peer memory, symmetric memory, NCCL).
The degree-1 case (a copy) keeps a timed case on one device.
"""
from fk_pytest import standard_tests
from kernels_reference.L1.all_reduce import TensorParallelAllReduce

from ..all_reduce_inputs import AllReduceTask


class AllReduce(AllReduceTask):
    name = "all_reduce"
    reference = TensorParallelAllReduce

    def init_args(self, case):
        return {}


TASK = AllReduce()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
