"""QKVParallelLinear: the fused q/k/v projection (qkv bias for Qwen2)."""
from fk_pytest import standard_tests
from kernels_reference.L1.linear import QKVParallelLinear

from ..configs import head_dim
from ..dense import DenseTask


class QKVTask(DenseTask):
    name = "qkv_parallel_linear"
    module_path = "L1/linear.py"
    reference = QKVParallelLinear

    def shape(self, cfg):
        hd, nq = head_dim(cfg), cfg["num_attention_heads"]
        nk = cfg.get("num_key_value_heads", nq)
        bias = cfg.get("attention_bias", False) or cfg["architectures"][0] == "Qwen2ForCausalLM"
        init = dict(hidden_size=cfg["hidden_size"], head_size=hd, total_num_heads=nq,
                    total_num_kv_heads=nk, bias=bias)
        return init, cfg["hidden_size"], (nq + 2 * nk) * hd


TASK = QKVTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
