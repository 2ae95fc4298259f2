"""MLAAttention (vLLM ``MLAAttention``, DeepSeek-V2): store the step's latent rows [kv_c_normed | k_pe]
into the paged latent cache by slot mapping, then every sequence's queries attend causally to its
history (keys and values expanded from the latent through ``kv_b_proj``). Batches mix decode, fresh
prefill and chunked prefill; the cache's post-call state is scored as an output."""
from fk_pytest import standard_tests
from kernels_reference.L1.mla_attention import MLAAttention

from ..dense import DenseTask
from ..mla import MLAPagedTask
from ..workload import activations


class MLAAttentionTask(MLAPagedTask):
    name = "mla_attention"
    level = 1
    module_path = "L1/mla_attention.py"
    reference = MLAAttention
    init_weights = DenseTask.init_weights

    def init_args(self, case):
        return dict(num_heads=case["heads"], scale=self.scale(case), qk_nope_head_dim=case["nope"],
                    qk_rope_head_dim=case["rope"], v_head_dim=case["v"], kv_lora_rank=case["rank"])

    def make_inputs(self, case, gen, device):
        t, h = sum(case["query"]), case["heads"]
        inputs = self.metadata_and_caches(case, gen, device)
        inputs["q"] = activations((t, h * (case["nope"] + case["rope"])), gen, device, case.dtype)
        inputs["kv_c_normed"] = activations((t, case["rank"]), gen, device, case.dtype)
        # k_pe as production passes it: the rope columns of the kv_a_proj_with_mqa output (strided rows)
        inputs["k_pe"] = activations((t, case["rank"] + case["rope"]), gen, device, case.dtype)[:, case["rank"]:]
        return inputs

    def io_bytes(self, case):
        return self.attention_io(case)

    def flops(self, case):
        return self.attention_flops(case)


TASK = MLAAttentionTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
