"""ParallelLMHead: last hidden states -> logits over the vocabulary.

Production computes logits only for each sequence's last token, so T is the number of sequences
(decode batch, or the prompts finishing prefill in a step). CPU profile: a 1/64 vocabulary shard.
"""
from fk_pytest import standard_tests
from kernels_reference.L1.vocab_parallel_embedding import ParallelLMHead

from ..dense import DenseTask
from .test_vocab_parallel_embedding import vocab_rows


class LMHeadTask(DenseTask):
    name = "parallel_lm_head"
    family = "embedding"
    module_path = "L1/vocab_parallel_embedding.py"
    reference = ParallelLMHead
    input_name = "hidden_states"
    tp_degrees = (2, 4)  # on the CPU: each rank's row range of the logits, all-gathered

    def cases(self, profile):
        self._profile = profile
        return [c for c in super().cases(profile) if c["tokens"] <= 256]  # one row per sequence

    def shape(self, cfg):
        vocab = vocab_rows(cfg, getattr(self, "_profile", "full"))
        return dict(num_embeddings=vocab, embedding_dim=cfg["hidden_size"], bias=False), cfg["hidden_size"], vocab

    def fuzz_strategy(self, dtype, profile):
        self._profile = profile
        return super().fuzz_strategy(dtype, profile)


TASK = LMHeadTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
