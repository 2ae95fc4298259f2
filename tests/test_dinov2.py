"""DINOv2's position embedding (L1) and layer (L3): the CUDA paths' torch code (run here on the CPU)
against the native definitions, and the tasks' verdicts on the honest trees and on wrong candidates,
each failing exactly on the cases that can see its bug. Agreement with Hugging Face is
tests/test_hf_dinov2.py."""
import pytest
import torch

from fk_pytest import status
from fk_pytest.registry import get_task
import torch.nn.functional as F

from kernels_reference.L1 import dinov2_embeddings
from kernels_reference.L1.dinov2_embeddings import Dinov2PositionEmbedding
from kernels_reference.L3.dinov2_layer import Dinov2Layer

from conftest import CANDIDATES, EXAMPLES, ROOT
from test_verdicts import assert_fails_exactly, assert_passes_every_case, load, verdicts


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)], ids=["fp32", "bf16"])
@pytest.mark.parametrize("grid", [(16, 16), (3, 5), (37, 37)], ids=["224px", "non-square", "native"])
def test_position_embedding_fast_path_matches_native(grid, dtype, tol):
    """Production's op sequence (the table rounded to the activation dtype before the add) is the
    definition within one rounding."""
    module = Dinov2PositionEmbedding(48)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        module.position_embeddings.copy_(torch.randn(module.position_embeddings.shape, generator=gen))
        module.cls_token.copy_(torch.randn(module.cls_token.shape, generator=gen))
    module = module.to(dtype)
    x = torch.randn(2, grid[0] * grid[1], 48, generator=gen).to(dtype)
    with torch.no_grad():  # inference writes into one output; with autograd on it concatenates
        got = module.forward_fast(x, *grid)
    torch.testing.assert_close(got, module.forward_fast(x, *grid), rtol=0, atol=0)
    want = module.forward_native(x, *grid)
    assert got.shape == want.shape == (2, 1 + grid[0] * grid[1], 48) and got.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("plan", ["kron", "rows"])
@pytest.mark.parametrize("grid", [(16, 16), (24, 32), (1, 1), (40, 45)], ids=["down", "non-square", "1x1", "up"])
def test_matrix_resampling_is_torch_bicubic(grid, plan, monkeypatch):
    """The CUDA path's resampling matrices (built from torch's bicubic definition) reproduce
    F.interpolate(bicubic, align_corners=False) in float64, to the float32 rounding of the weights,
    whether as one kron matrix or as rows then columns."""
    monkeypatch.setattr(dinov2_embeddings, "_KRON_ELEMENTS", 1 << 24 if plan == "kron" else 0)
    dinov2_embeddings._resampling.cache_clear()
    h, w = grid
    pos = torch.randn(1, 1 + 37 * 37, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    image = pos[:, 1:].reshape(1, 37, 37, 8).permute(0, 3, 1, 2)
    want = F.interpolate(image, size=grid, mode="bicubic", align_corners=False).permute(0, 2, 3, 1)
    want = torch.cat((pos[:, :1], want.reshape(1, h * w, 8)), dim=1)
    got = dinov2_embeddings.resample_on_device(pos.float(), 37, h, w).double()
    dinov2_embeddings._resampling.cache_clear()
    torch.testing.assert_close(got, want, rtol=0, atol=2e-6)


def test_position_embedding_refuses_a_grid_that_is_not_the_tokens():
    with pytest.raises(ValueError, match=r"\[B, 4 \* 4, 48\]"):
        Dinov2PositionEmbedding(48)(torch.zeros(1, 15, 48), 4, 4)


def test_layer_forward_matches_native():
    """On the CPU ``forward`` differs from ``forward_native`` only in the LayerScale step (addcmul)."""
    layer = Dinov2Layer(64, 4)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (p.shape[-1] ** -0.5 if p.dim() == 2 else 0.3))
    x = torch.randn(2, 10, 64, generator=gen)
    torch.testing.assert_close(layer(x), layer.forward_native(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("task_name, tree", [
    ("dinov2_position_embedding", EXAMPLES), ("dinov2_position_embedding", ROOT / "kernels_reference"),
    ("dinov2_layer", EXAMPLES),
], ids=["embedding-examples", "embedding-reference-tree", "layer-examples"])
def test_honest_candidates_pass_every_case(task_name, tree):
    assert_passes_every_case(task_name, tree)


@pytest.mark.parametrize("task_name, tree", [
    # every CPU grid is resampled from the 37 x 37 table, so every case sees the filter, the
    # sample centres and the rows taken
    ("dinov2_position_embedding", "pos_bilinear"),
    ("dinov2_position_embedding", "pos_align_corners"),
    ("dinov2_position_embedding", "pos_cls_row_in_grid"),
    ("dinov2_position_embedding", "pos_cls_appended"),
    ("dinov2_layer", "dinov2_layerscale_after_add"),
], ids=["bilinear", "align-corners", "cls-row-in-grid", "cls-appended", "layerscale-after-add"])
def test_wrong_candidates_fail_exactly_where_expected(task_name, tree):
    assert_fails_exactly(task_name, tree, lambda c: True)


@pytest.mark.parametrize("tree", ["pos_bilinear", "pos_align_corners"], ids=["bilinear", "align-corners"])
def test_resampling_bugs_pass_on_the_native_grid(tree):
    """At the native 37 x 37 grid either filter samples the table's own cells: their failures on
    the real cases are the resampling and nothing else."""
    task = get_task("dinov2_position_embedding")
    case = task.grid_case(37, 37, 1, torch.bfloat16)
    counts, _ = verdicts("dinov2_position_embedding", load(CANDIDATES / tree, "dinov2_position_embedding"), [case])
    assert counts == {status.PASSED: 1}


@pytest.mark.parametrize("grid, dtype, batch", [((4, 4), torch.float32, 5), ((5, 9), torch.bfloat16, 2),
                                                ((7, 7), torch.bfloat16, 1)],
                         ids=["down-fp32-B5", "down-up-bf16-B2", "native-bf16-B1"])
def test_position_embedding_triton_kernel_is_the_fast_path(grid, dtype, batch, monkeypatch):
    """The one-launch Triton kernel (run in the interpreter, on a 7 x 7 native grid to keep it
    short) gives the torch fast path's result within one rounding of the activation dtype (its 16
    taps sum in another order than the kron product, and the interpreter rounds to bfloat16 its own
    way), the class row and every image of the batch included, from patch tokens with a row stride."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from kernels_reference.ops.position_embedding import bicubic_add
    monkeypatch.setattr(bicubic_add, "MAX_BLOCK_D", 128)  # 160 channels: two blocks, one masked
    monkeypatch.setattr(bicubic_add, "IMAGES_PER_PROGRAM", 4)
    module = Dinov2PositionEmbedding(160, image_size=98, patch_size=14)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        module.position_embeddings.copy_(torch.randn(module.position_embeddings.shape, generator=gen))
        module.cls_token.copy_(torch.randn(module.cls_token.shape, generator=gen))
    module = module.to(dtype)
    wide = torch.randn(batch, grid[0] * grid[1], 200, generator=gen).to(dtype)  # B5: two programs of images, the second masked
    x = wide[..., 20:180]
    with torch.no_grad():
        got, want = module.forward_triton(x, *grid), module.forward_fast(x, *grid)
    assert got.shape == want.shape and got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2 ** -6  # bf16: one unit in the last place at |x| < 4
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    native = module.forward_native(x, *grid)  # and the definition, within the bar's order
    torch.testing.assert_close(got.float(), native.float(), rtol=2 * tol, atol=2 * tol)
