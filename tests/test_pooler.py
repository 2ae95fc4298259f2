"""Pooler: the reference's Triton kernels (interpreted) against its native definition, the native
definition against sentence-transformers' padded-batch pooling in float64, the output dtype, and
the task's verdicts on the honest candidates and on four wrong ones, each failing exactly on the
cases that can see its bug."""
import pytest
import torch
import torch.nn.functional as F

from kernels_reference.L1.pooler import Pooler, PoolTiles, pool_sequences

from conftest import EXAMPLES, ROOT
from test_verdicts import assert_fails_exactly, assert_passes_every_case

triton = pytest.importorskip("triton")

LENGTHS = (5, 1, 150, 3)  # a one-token sequence, and one longer than a token tile


@pytest.mark.parametrize("pooling_type", ["MEAN", "CLS", "LAST"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_matches_native(monkeypatch, pooling_type, dtype):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    gen = torch.Generator().manual_seed(len(pooling_type))
    width = 1000  # not a power of two: a masked column tail
    # packed rows of a wider buffer (strided), with a per-channel offset as final hidden states have
    wide = torch.randn(sum(LENGTHS), width + 24, generator=gen) + torch.randn(width + 24, generator=gen)
    hidden = wide.to(dtype)[:, :width]
    lens = torch.tensor(LENGTHS)
    for normalize in (True, False):
        pooler = Pooler(pooling_type, normalize)
        got, want = pooler.forward_triton(hidden, lens), pooler.forward_native(hidden, lens)
        assert got.shape == (len(LENGTHS), width) and got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)  # both float32 from the same inputs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_mean_matches_native(monkeypatch, dtype):
    """The GPU's split mean in the interpreter: 40 columns in blocks of 16, tiles of 4 tokens, three
    programs a sequence. 150 tokens split 52 + 52 + 46 (uneven, a partial last tile), 5 tokens
    4 + 1 + nothing, 1 token 1 + nothing + nothing: splits past a sequence's end store zeros."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    gen = torch.Generator().manual_seed(7)
    wide = torch.randn(sum(LENGTHS), 48, generator=gen) + torch.randn(48, generator=gen)
    hidden = wide.to(dtype)[:, :40]  # strided rows, as in the test above
    lens = torch.tensor(LENGTHS, dtype=torch.int32)
    for normalize in (True, False):
        got = pool_sequences(hidden, lens, "MEAN", normalize, PoolTiles(block=16, tokens=4, splits=3))
        want = Pooler("MEAN", normalize).forward_native(hidden, lens)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)


def _padded_batch_pooling(hidden, lengths, pooling_type, normalize):
    """sentence-transformers' way: a [B, longest, H] batch with an attention mask (the right-padded
    rows zero), mean as the masked sum over the mask's count, CLS the first position, last token
    the position len - 1; then ``F.normalize``."""
    seqs = hidden.split(list(lengths))
    padded = torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True)
    mask = (torch.arange(padded.shape[1])[None, :] < torch.tensor(lengths)[:, None]).to(hidden.dtype)
    if pooling_type == "MEAN":
        pooled = (padded * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    elif pooling_type == "CLS":
        pooled = padded[:, 0]
    else:
        pooled = padded[torch.arange(len(lengths)), torch.tensor(lengths) - 1]
    return F.normalize(pooled, p=2, dim=-1) if normalize else pooled


@pytest.mark.parametrize("pooling_type", ["MEAN", "CLS", "LAST"])
def test_native_is_padded_batch_pooling_in_float64(pooling_type):
    gen = torch.Generator().manual_seed(11)
    lengths = (7, 1, 12, 4)
    hidden = torch.randn(sum(lengths), 96, generator=gen, dtype=torch.float64)
    for normalize in (True, False):
        want = _padded_batch_pooling(hidden, lengths, pooling_type, normalize)
        got = Pooler(pooling_type, normalize).forward_native(hidden, torch.tensor(lengths))
        assert got.dtype == torch.float64  # the truth keeps float64
        torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_embeddings_are_float32(dtype):
    """vLLM runs pooling heads in float32 (head_dtype): embeddings of a bf16 model are float32."""
    hidden = torch.randn(6, 32).to(dtype)
    for pooling_type in ("MEAN", "CLS", "LAST"):
        assert Pooler(pooling_type).forward_native(hidden, torch.tensor([2, 4])).dtype == torch.float32
    with pytest.raises(ValueError, match="pooling_type"):
        Pooler("ALL")


@pytest.mark.parametrize("tree", [EXAMPLES, ROOT / "kernels_reference"], ids=["examples-triton", "reference-tree"])
def test_honest_candidates_pass_every_case(tree):
    assert_passes_every_case("pooler", tree)


def _mixed_lengths(case):
    return len(set(case["lengths"])) > 1


@pytest.mark.parametrize("tree, failing", [
    # the scale of a mean cancels in the normalisation: only raw means over unequal lengths see it
    ("pool_padded_mean", lambda c: c["pooling_type"] == "MEAN" and not c["normalize"] and _mixed_lengths(c)),
    ("pool_no_normalize", lambda c: c["normalize"]),
    # a single sequence has no boundary to get wrong
    ("pool_next_token", lambda c: c["pooling_type"] == "MEAN" and len(c["lengths"]) > 1),
    ("pool_cls_from_end", lambda c: c["pooling_type"] == "CLS"),
], ids=["padded-mean", "no-normalize", "next-token", "cls-from-end"])
def test_wrong_candidates_fail_exactly_where_expected(tree, failing):
    assert_fails_exactly("pooler", tree, failing, some_pass=True)
