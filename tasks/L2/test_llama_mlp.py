"""LlamaMLP (L2): gate_up_proj -> SiluAndMul -> down_proj, the layer's biggest GEMMs."""
import torch

from fk_pytest import standard_tests
from kernels_reference.L2.llama_mlp import LlamaMLP

from ..dense import DenseTask


class LlamaMLPTask(DenseTask):
    name = "llama_mlp"
    level = 2
    family = "mlp"
    module_path = "L2/llama_mlp.py"
    reference = LlamaMLP

    def shape(self, cfg):
        return dict(hidden_size=cfg["hidden_size"], intermediate_size=cfg["intermediate_size"]), \
            cfg["hidden_size"], cfg["hidden_size"]

    def io_bytes(self, case):
        t, h, i = case["tokens"], case["init"]["hidden_size"], case["init"]["intermediate_size"]
        return (2 * t * h + 3 * h * i) * torch.finfo(case.dtype).bits // 8

    def flops(self, case):
        t, h, i = case["tokens"], case["init"]["hidden_size"], case["init"]["intermediate_size"]
        return 2 * t * 3 * h * i


TASK = LlamaMLPTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
