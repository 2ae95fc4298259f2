"""The trained all-MiniLM-L6-v2 through our BertModel + Pooler (a packed batch, mean pooling, L2
normalised) equals HF transformers' BertModel with sentence-transformers' pooling (a padded batch,
the mean over the attention mask, L2 normalised), both reading the same safetensors file: the
embeddings in float32 and float64, and the nearest-neighbour ranking of real sentences in float32
and bfloat16. A model with a realistic bug fails the same checks."""
import copy
import dataclasses
import pathlib
import re

import pytest
import torch
import torch.nn.functional as F

from kernels_reference.minilm import (MINILM_MISSING, embed, load_minilm, minilm_dir, minilm_pooler,
                                      minilm_tokenizer)

transformers = pytest.importorskip("transformers", reason="the HF comparison needs transformers")
MODEL_DIR = minilm_dir()
pytestmark = pytest.mark.skipif(MODEL_DIR is None, reason=MINILM_MISSING)

from kernels_reference.L1.pooler import Pooler  # noqa: E402
from kernels_reference.L4.bert import BertModel  # noqa: E402

CORPUS = pathlib.Path(__file__).resolve().parents[1] / "tasks" / "corpus.txt"
PARAGRAPHS = 16  # x2 texts: each paragraph (50-75 tokens) and its first sentence (10-25 tokens)
FLOAT64_TEXTS = 8  # near-exactness needs no more, and float64 is the slow run on the CPU
TOP_K = 5
# float32: 1.5e-7 measured (HF's own float32 run is 1.4e-7 from its float64 one: a few float32
# roundings of a unit vector's entries through six layers); 1e-6 keeps a margin of ~7x for other
# BLAS builds while a wrong model is off by 0.08 or more.
FLOAT32_BOUND = 1e-6
FLOAT64_BOUND = 1e-12  # 3e-16 measured: the two float64 evaluations differ only in summation order
# bfloat16: a cosine similarity moved by at most 2.6e-3 (bf16's unit roundoff is 2^-9 = 2e-3); the
# ranking is compared modulo near-ties within twice that (see ranking_disagreements).
BF16_EMBEDDING_BOUND = 1e-2
BF16_TIE_WIDTH = 5e-3


def corpus_texts():
    """Short and long real texts interleaved: paragraph i's first sentence, then the whole paragraph
    (so each sentence's nearest neighbour is its own paragraph, the rest a real ranking)."""
    paragraphs = [p.strip() for p in CORPUS.read_text().split("\n\n") if p.strip()][:PARAGRAPHS]
    texts = []
    for paragraph in paragraphs:
        texts += [re.split(r"(?<=[.!?]) ", paragraph)[0], paragraph]
    return texts


def hf_model():
    """HF's BertModel from the directory's config, then its safetensors file by name (every weight
    delivered; the checkpoint's unused pooler head and index buffer are the only names left over)."""
    from safetensors.torch import load_file
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # transformers 4
        from transformers.modeling_utils import no_init_weights

    config = transformers.BertConfig.from_json_file(str(MODEL_DIR / "config.json"))
    with no_init_weights():  # 1.6 s of random initialisation on a CPU, all of it overwritten
        model = transformers.BertModel(config, add_pooling_layer=False)
    result = model.load_state_dict(load_file(str(MODEL_DIR / "model.safetensors")), strict=False)
    assert result.missing_keys == []
    assert set(result.unexpected_keys) <= {"pooler.dense.weight", "pooler.dense.bias", "embeddings.position_ids"}
    return model.eval()


def hf_embed(model, tokenizer, texts):
    """sentence-transformers' embedding: a right-padded batch, the mean of the hidden states over the
    attention mask, L2 normalised. Short and long texts go in separate batches only to pad less."""
    encodings = tokenizer.encode_batch(texts)
    order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
    out = torch.empty(len(texts), model.config.hidden_size, dtype=next(model.parameters()).dtype)
    for group in (order[:len(order) // 2], order[len(order) // 2:]):
        width = max(len(encodings[i].ids) for i in group)
        ids = torch.zeros(len(group), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, i in enumerate(group):
            ids[row, :len(encodings[i].ids)] = torch.tensor(encodings[i].ids)
            mask[row, :len(encodings[i].ids)] = 1
        with torch.no_grad():
            hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        out[group] = F.normalize((hidden * weights).sum(1) / weights.sum(1), p=2.0, dim=-1)
    return out


def ranking_disagreements(ours, truth, tie_width=0.0):
    """Texts whose top-k neighbours by cosine similarity (self excluded) differ from ``truth``'s.

    Our j-th pick counts as right when ``truth`` rates it within ``tie_width`` of its own j-th best
    similarity: a swap of neighbours that the truth itself cannot tell apart by more than our
    precision's error is not a wrong ranking. ``tie_width=0`` asks for the identical ranking."""
    def similarities(e):
        s = e.double() @ e.double().T
        return s.fill_diagonal_(-2.0)

    want = similarities(truth)
    picks = similarities(ours).topk(TOP_K, dim=1).indices
    shortfall = want.topk(TOP_K, dim=1).values - want.gather(1, picks)
    return [i for i in range(len(want)) if shortfall[i].abs().max().item() > tie_width]


def max_diff(a, b):
    return (a.double() - b.double()).abs().max().item()


class Runs:
    """Every embedding the tests compare, computed once per module (each costs 0.3-1 s on a CPU)."""

    def __init__(self):
        self.texts = corpus_texts()
        self.tokenizer = minilm_tokenizer(MODEL_DIR)
        self.pooler = minilm_pooler(MODEL_DIR)
        self.ours = load_minilm(MODEL_DIR, torch.float32)
        self.hf = hf_model()
        self.hf32 = hf_embed(self.hf, self.tokenizer, self.texts)
        self.ours32 = self.embed(self.ours)

    def embed(self, model, pooler=None):
        return embed(model, pooler or self.pooler, self.texts, tokenizer=self.tokenizer)

    def check(self, embeddings):
        """What the float32 tests assert, as a list of failures (empty: the model passes)."""
        failures = []
        if max_diff(embeddings, self.hf32) >= FLOAT32_BOUND:
            failures.append(f"max |diff| {max_diff(embeddings, self.hf32):.3g} vs HF float32")
        wrong = ranking_disagreements(embeddings, self.hf32)
        if wrong:
            failures.append(f"top-{TOP_K} neighbours differ for texts {wrong}")
        return failures


@pytest.fixture(scope="module")
def runs():
    return Runs()


def test_batch_mixes_short_and_long_real_texts(runs):
    lengths = [len(e.ids) for e in runs.tokenizer.encode_batch(runs.texts)]
    assert len(runs.texts) == 2 * PARAGRAPHS and min(lengths) <= 16 and max(lengths) >= 64


def test_float32_embeddings_and_ranking_match_hf(runs):
    assert runs.ours32.shape == (len(runs.texts), 384) and runs.ours32.dtype == torch.float32
    assert runs.check(runs.ours32) == []


def test_float64_embeddings_are_nearly_exact(runs):
    texts = runs.texts[:FLOAT64_TEXTS]
    want = hf_embed(copy.deepcopy(runs.hf).double(), runs.tokenizer, texts)
    got = embed(copy.deepcopy(runs.ours).double(), runs.pooler, texts, tokenizer=runs.tokenizer)
    assert got.dtype == torch.float64
    assert max_diff(got, want) < FLOAT64_BOUND


def test_bfloat16_ranking_matches_hf_float32_up_to_near_ties(runs):
    """bf16 flips near-ties (3 of 32 texts measured, neighbours HF rates 1.4e-3 apart at most): a
    pick counts as right when HF's float32 similarities cannot separate it by more than the
    measured bf16 error of a similarity, and wrong beyond that."""
    got = runs.embed(load_minilm(MODEL_DIR, torch.bfloat16))
    assert got.dtype == torch.float32  # vLLM's pooling head runs in float32
    assert max_diff(got, runs.hf32) < BF16_EMBEDDING_BOUND
    assert ranking_disagreements(got, runs.hf32, tie_width=BF16_TIE_WIDTH) == []


def _offset_by_one(runs):
    """Positions numbered from 1, as a BERT loaded with XLM-R's (padding-based) numbering would be."""
    model = BertModel(dataclasses.replace(runs.ours.config, position_offset=1))
    model.load_state_dict(runs.ours.state_dict())
    return runs.embed(model.eval())


def _cls_pooled(runs):
    """The [CLS] row instead of the mean: BGE-M3's pooling applied to a mean-pooled model."""
    return runs.embed(runs.ours, Pooler("CLS", normalize=True))


@pytest.mark.parametrize("wrong_model", [_offset_by_one, _cls_pooled], ids=["position-offset", "cls-pooling"])
def test_wrong_model_fails_the_checks(runs, wrong_model):
    embeddings = wrong_model(runs)
    failures = runs.check(embeddings)
    assert len(failures) == 2, failures  # the embeddings and the ranking are each off
    assert ranking_disagreements(embeddings, runs.hf32, tie_width=BF16_TIE_WIDTH)  # beyond bf16's ties too


def test_tokenizer_truncates_at_max_seq_length_without_padding(runs):
    encodings = runs.tokenizer.encode_batch([CORPUS.read_text(), "A short line."])
    assert len(encodings[0].ids) == 256  # sentence_bert_config.json's max_seq_length, not tokenizer.json's 128
    assert encodings[0].ids[0] == runs.tokenizer.token_to_id("[CLS]")
    assert encodings[0].ids[-1] == runs.tokenizer.token_to_id("[SEP]")
    assert len(encodings[1].ids) == 6  # [CLS] a short line . [SEP], no padding


def test_pooling_read_from_the_model_directory():
    pooler = minilm_pooler(MODEL_DIR)
    assert (pooler.pooling_type, pooler.normalize) == ("MEAN", True)
