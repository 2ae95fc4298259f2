"""DINOv3's 2-D rotary embedding (L1): the reference's Triton kernel (interpreted) against its native
definition, the module's refusals, and the task's verdicts on the honest trees and on wrong
candidates, each failing exactly on the cases that can see its bug. Agreement with Hugging Face's
``DINOv3ViTRopePositionEmbedding`` + ``apply_rotary_pos_emb`` is tests/test_hf_dinov3.py."""
import pytest
import torch

from kernels_reference.L1.rope_2d import DINOv3ViTRopePositionEmbedding

from conftest import EXAMPLES, ROOT
from test_verdicts import assert_fails_exactly, assert_passes_every_case

triton = pytest.importorskip("triton")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("grid, batch, heads, prefix", [((3, 2), 2, 16, 5), ((2, 5), 3, 3, 1), ((1, 1), 1, 2, 0)],
                         ids=["vitl-heads", "odd-heads", "one-patch-no-prefix"])
def test_triton_matches_native(monkeypatch, grid, batch, heads, prefix, dtype):
    """In place on the qkv output's column views (the layer's call) and on a transposed [B, S, H, d]
    view; the prefix rows come back bit for bit, the patch rows within one rounding of the native
    path (the interpreter's bf16 cast may round the other way)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    rope = DINOv3ViTRopePositionEmbedding(64, 100.0, prefix)
    gen = torch.Generator().manual_seed(sum(grid) + heads)
    tokens, width = prefix + grid[0] * grid[1], heads * 64
    qkv = (2 * torch.randn(batch, tokens, 3 * width, generator=gen)).to(dtype)
    query, key = qkv[..., :width], qkv[..., width:2 * width]
    want_q, want_k = rope.forward_native(query, key, *grid)
    before = qkv.clone()
    got_q, got_k = rope.forward_triton(query, key, *grid)
    assert got_q.data_ptr() == query.data_ptr() and got_k.data_ptr() == key.data_ptr()  # rotated in place
    assert torch.equal(qkv[:, :prefix], before[:, :prefix])
    assert torch.equal(qkv[..., 2 * width:], before[..., 2 * width:])  # v untouched
    tol = dict(rtol=0, atol=0) if dtype == torch.float32 else dict(rtol=2.0 ** -7, atol=1e-3)
    for got, want in ((got_q, want_q), (got_k, want_k)):
        assert got.shape == want.shape and got.dtype == dtype
        torch.testing.assert_close(got.float(), want.float(), **tol)

    transposed = torch.randn(batch, heads, tokens, 64, generator=gen).to(dtype).transpose(1, 2)
    want, _ = rope.forward_native(transposed, transposed, *grid)
    got, _ = rope.forward_triton(transposed.clone(), transposed.clone(), *grid)
    torch.testing.assert_close(got.float(), want.float(), **tol)


def test_native_leaves_the_prefix_and_rotates_by_the_grid():
    """Prefix rows pass unchanged; a patch's rotation keeps each feature pair's norm; a 1 x 1 grid's
    patch sits at the centre (angle 0) and is not turned either."""
    rope = DINOv3ViTRopePositionEmbedding(8, 100.0, 2)
    x = torch.randn(1, 2 + 6, 16, dtype=torch.float64)
    out, _ = rope.forward_native(x, x, 2, 3)
    assert torch.equal(out[:, :2], x[:, :2])
    pair_norm = lambda t: t.unflatten(-1, (2, 2, 4)).pow(2).sum(-2)  # noqa: E731  (c, c + d/2) pairs
    torch.testing.assert_close(pair_norm(out), pair_norm(x), rtol=1e-12, atol=1e-12)
    centre = torch.randn(1, 3, 16, dtype=torch.float64)
    assert torch.equal(rope.forward_native(centre, centre, 1, 1)[0], centre)


@pytest.mark.parametrize("shape, grid, message", [
    ((1, 8, 64), (2, 2), r"8 tokens for a 2 x 2 grid; expected 5 prefix \+ 4 patch tokens = 9"),
    ((1, 9, 60), (2, 2), r"expected \[B, S, heads \* 64\] or \[B, S, heads, 64\]"),
], ids=["token-count", "head-size"])
def test_refuses_inputs_that_are_not_the_prefix_and_the_grid(shape, grid, message):
    rope = DINOv3ViTRopePositionEmbedding(64, 100.0, 5)
    with pytest.raises(ValueError, match=message):
        rope(torch.zeros(shape), torch.zeros(shape), *grid)


@pytest.mark.parametrize("tree", [EXAMPLES, ROOT / "kernels_reference"], ids=["examples-triton", "reference-tree"])
def test_honest_candidates_pass_every_case(tree):
    assert_passes_every_case("rope_2d", tree)


@pytest.mark.parametrize("tree, failing", [
    # every CPU case has the 5 prefix tokens in front of the patches
    ("rope2d_patches_first", lambda c: True),
    # every CPU grid has patches off its diagonal
    ("rope2d_axes_swapped", lambda c: True),
    # the same coordinates as the model's on a square grid
    ("rope2d_max_normalised", lambda c: c["grid_height"] != c["grid_width"]),
], ids=["patches-first", "axes-swapped", "max-normalised"])
def test_wrong_candidates_fail_exactly_where_expected(tree, failing):
    assert_fails_exactly("rope_2d", tree, failing, some_pass=tree == "rope2d_max_normalised")
