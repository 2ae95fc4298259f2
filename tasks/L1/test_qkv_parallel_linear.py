"""QKVParallelLinear: the fused q/k/v projection (qkv bias for Qwen2).

Also at tensor-parallel degrees 2 and 4 on the CPU profile (:mod:`fk_pytest.tp_eval`), on the first
model whose heads both degrees divide: rank r holds its q heads and its KV heads, [q_r | k_r | v_r];
the ranks' outputs are put back as [q_0 .. q_n | k | v] (ranks that share a replicated KV head must
agree on it) to be judged.
"""
import torch

from fk_pytest import standard_tests
from fk_pytest.task import RanksDisagree
from kernels_reference.L1.linear import QKVParallelLinear

from ..configs import head_dim
from ..dense import DenseTask


class QKVTask(DenseTask):
    name = "qkv_parallel_linear"
    module_path = "L1/linear.py"
    reference = QKVParallelLinear
    tp_degrees = (2, 4)

    def shape(self, cfg):
        hd, nq = head_dim(cfg), cfg["num_attention_heads"]
        nk = cfg.get("num_key_value_heads", nq)
        bias = cfg.get("attention_bias", False) or cfg["architectures"][0] == "Qwen2ForCausalLM"
        init = dict(hidden_size=cfg["hidden_size"], head_size=hd, total_num_heads=nq,
                    total_num_kv_heads=nk, bias=bias)
        return init, cfg["hidden_size"], (nq + 2 * nk) * hd

    def assemble_ranks(self, outputs, case):
        init, tp = case["init"], len(outputs)
        hd, nq, nk = init["head_size"], init["total_num_heads"], init["total_num_kv_heads"]
        replicas, kv = (tp // nk, 1) if tp >= nk else (1, nk // tp)
        parts = [out[0].split([nq // tp * hd, kv * hd, kv * hd], dim=-1) for out in outputs]
        for r in range(tp):  # ranks sharing a KV head must hold the same K and V
            first = r - r % replicas
            if r != first and not (torch.equal(parts[r][1], parts[first][1]) and torch.equal(parts[r][2], parts[first][2])):
                raise RanksDisagree(f"rank {r}'s K/V differ from rank {first}'s although they hold the same KV head")
        owners = range(0, tp, replicas)
        return [torch.cat([p[0] for p in parts] + [parts[r][1] for r in owners] + [parts[r][2] for r in owners], dim=-1)]


TASK = QKVTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
