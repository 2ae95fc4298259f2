"""DeepseekV2MLAAttention (L2, vLLM's name): q projection, latent projection + RMSNorm, DeepSeek's
YaRN rope (interleaved) on the rope parts, multi-head latent attention over the paged latent cache,
o_proj. Softmax scale with YaRN's mscale as HF."""
from fk_pytest import standard_tests
from kernels_reference.L2.deepseek_v2_attention import DeepseekV2MLAAttention

from ..configs import load_config
from ..dense import DenseTask
from ..mla import MLAPagedTask
from ..workload import activations


class DeepseekV2AttentionTask(MLAPagedTask):
    name = "deepseek_v2_attention"
    level = 2
    module_path = "L2/deepseek_v2_attention.py"
    reference = DeepseekV2MLAAttention
    init_weights = DenseTask.init_weights

    def init_args(self, case):
        cfg = load_config(case["model"])
        return dict(hidden_size=case["hidden"], num_heads=case["heads"], qk_nope_head_dim=case["nope"],
                    qk_rope_head_dim=case["rope"], v_head_dim=case["v"], q_lora_rank=case["q_lora_rank"],
                    kv_lora_rank=case["rank"], rope_theta=cfg["rope_theta"], rope_scaling=cfg["rope_scaling"],
                    max_position_embeddings=cfg["max_position_embeddings"], rms_norm_eps=cfg["rms_norm_eps"])

    def make_inputs(self, case, gen, device):
        inputs = self.metadata_and_caches(case, gen, device)
        inputs["positions"] = inputs["metadata"].positions()
        inputs["hidden_states"] = activations((sum(case["query"]), case["hidden"]), gen, device, case.dtype)
        return inputs

    def _projection_weights(self, case) -> int:
        h, hidden = case["heads"], case["hidden"]
        q = hidden * h * (case["nope"] + case["rope"])  # q_lora_rank is None for V2-Lite
        return q + hidden * (case["rank"] + case["rope"]) + h * case["v"] * hidden

    def io_bytes(self, case):
        return self.attention_io(case) + self._projection_weights(case) * 2

    def flops(self, case):
        return self.attention_flops(case) + 2 * sum(case["query"]) * self._projection_weights(case)


TASK = DeepseekV2AttentionTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
