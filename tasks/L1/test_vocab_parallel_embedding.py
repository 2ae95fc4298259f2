"""VocabParallelEmbedding: token ids -> hidden states (a gather; ids below the vocabulary).

The CPU profile embeds with a 1/64 shard of the vocabulary (what one GPU holds at TP=64-like
sharding) to keep the float64 truth small; the GPU profile uses the whole vocabulary.
"""
import torch
from hypothesis import strategies as st

from fk_pytest import Case, standard_tests
from fk_pytest.fuzz import token_counts
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L1.vocab_parallel_embedding import VocabParallelEmbedding

from ..configs import load_config
from ..dense import DenseTask
from ..workload import model_dtype

CPU_VOCAB_SHARD = 64


def vocab_rows(cfg, profile):
    return cfg["vocab_size"] // (CPU_VOCAB_SHARD if profile == "cpu" else 1)


class EmbeddingTask(DenseTask):
    name = "vocab_parallel_embedding"
    family = "embedding"
    module_path = "L1/vocab_parallel_embedding.py"
    reference = VocabParallelEmbedding
    tp_degrees = (2, 4)  # on the CPU: the vocabulary split in row ranges, rows all-reduced

    def cases(self, profile):
        out = []
        for model in self.model_list(profile):
            cfg, dt = load_config(model), model_dtype(model)
            vocab = vocab_rows(cfg, profile)
            for phase, t, weight, source in self.token_entries(model, profile, None):
                out.append(Case(f"{model}-{phase}-T{t}-{DTYPE_NAMES[dt]}", dt, model=model, weight=weight,
                                params=dict(init=dict(num_embeddings=vocab, embedding_dim=cfg["hidden_size"]),
                                            tokens=t, source=source)))
        return self.with_tp_cases(out, profile)

    def captured_select(self, fan_in):
        return lambda group: True  # token ids in: every captured call is this task's

    def init_weights(self, module, gen):
        with torch.no_grad():
            module.weight.copy_(torch.randn(module.weight.shape, generator=gen, device=module.weight.device) * 0.02 + 0.01)

    def make_inputs(self, case, gen, device):
        vocab = case["init"]["num_embeddings"]
        return {"input_ids": torch.randint(0, vocab, (case["tokens"],), generator=gen, device=device)}

    def fuzz_strategy(self, dtype, profile):
        @st.composite
        def draw_case(draw):
            model = draw(st.sampled_from(self.model_list(profile)))
            cfg = load_config(model)
            t = draw(token_counts(1000))
            init = dict(num_embeddings=vocab_rows(cfg, profile), embedding_dim=cfg["hidden_size"])
            return Case(f"fuzz-{model}-T{t}-{DTYPE_NAMES[dtype]}", dtype, model=model, params=dict(init=init, tokens=t))

        return draw_case()

    def io_bytes(self, case):
        return case["tokens"] * (8 + 2 * case["init"]["embedding_dim"] * torch.finfo(case.dtype).bits // 8)

    def flops(self, case):
        return 0


TASK = EmbeddingTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
