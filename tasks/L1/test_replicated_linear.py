"""ReplicatedLinear: Mixtral's expert router (hidden -> num_experts logits), replicated in TP."""
from fk_pytest import standard_tests
from kernels_reference.L1.linear import ReplicatedLinear

from ..dense import DenseTask


class RouterTask(DenseTask):
    name = "replicated_linear"
    module_path = "L1/linear.py"
    reference = ReplicatedLinear
    models = ("mixtral-8x7b",)

    def shape(self, cfg):
        return dict(input_size=cfg["hidden_size"], output_size=cfg["num_local_experts"], bias=False), \
            cfg["hidden_size"], cfg["num_local_experts"]


TASK = RouterTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
