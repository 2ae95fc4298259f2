"""Attention (vLLM ``Attention`` layer): store the step's K/V by slot mapping, then attend over the
paged cache: packed varlen prefill, chunked prefill reading earlier chunks, and decode."""
from fk_pytest import standard_tests
from kernels_reference.L1.attention import Attention

from ..paged import PagedTask
from ..workload import activations


class AttentionTask(PagedTask):
    name = "attention"
    level = 1
    module_path = "L1/attention.py"
    reference = Attention
    models = {"cpu": ("llama-3.1-8b", "qwen2.5-7b"), "full": PagedTask.models["full"]}

    def cases(self, profile):
        return self.captured_batch_cases(profile, lambda model: {})

    def init_args(self, case):
        nq, nk, hd = self.heads(case)
        return dict(num_heads=nq, head_size=hd, scale=hd ** -0.5, num_kv_heads=nk)

    def make_inputs(self, case, gen, device):
        nq, nk, hd = self.heads(case)
        t = sum(case["query"])
        qkv = activations((t, (nq + 2 * nk) * hd), gen, device, case.dtype)  # q, k, v as slices of qkv
        inputs = {"query": qkv[:, : nq * hd], "key": qkv[:, nq * hd: (nq + nk) * hd],
                  "value": qkv[:, (nq + nk) * hd:]}
        inputs.update(self.metadata_and_caches(case, gen, device))
        return inputs

    def io_bytes(self, case):
        return self.attention_io(case)

    def flops(self, case):
        return self.attention_flops(case)


TASK = AttentionTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
