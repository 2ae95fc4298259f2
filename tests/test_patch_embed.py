"""PatchEmbed: the CUDA path's code (``F.conv2d``, run here on the CPU) against the native
definition, the native definition against timm's ``Conv2d`` + ``flatten(2).transpose(1, 2)`` in
float64 on a timm state dict, and the task's verdicts on the honest candidates and on five wrong
ones, each failing exactly on the cases that can see its bug."""
import pytest
import torch
from torch import nn

from fk_pytest import status
from fk_pytest.registry import get_task
from kernels_reference.L1.patch_embed import PatchEmbed

from conftest import CANDIDATES, EXAMPLES, ROOT
from test_verdicts import assert_fails_exactly, assert_passes_every_case, load, verdicts


def _embed(patch, dim, dtype=torch.float64, seed=0, **kw):
    gen = torch.Generator().manual_seed(seed)
    embed = PatchEmbed(img_size=224, patch_size=patch, in_chans=3, embed_dim=dim, **kw)
    with torch.no_grad():
        embed.proj.weight.copy_(torch.randn(embed.proj.weight.shape, generator=gen) * (3 * patch * patch) ** -0.5)
        embed.proj.bias.copy_(0.2 * torch.randn(dim, generator=gen))
    return embed.to(dtype), gen


@pytest.mark.parametrize("flatten", [True, False], ids=["tokens", "grid"])
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-5), (torch.bfloat16, 1.6e-2)],
                         ids=["fp64", "fp32", "bf16"])
@pytest.mark.parametrize("path", ["forward_conv", "forward_gemm"])
def test_fast_paths_match_native(dtype, tol, flatten, path):
    """A channels-last 2-image batch, 3 x 4 patches of 14 with pixels past the last whole patch on
    both axes (SigLIP's 384 px case): cuDNN's call (float32 on CUDA), the one-GEMM form (half types
    on CUDA) and the patches-times-weight product agree."""
    embed, gen = _embed(14, 72, dtype, flatten=flatten)
    x = torch.randn(2, 3, 14 * 3 + 5, 14 * 4 + 6, generator=gen).to(dtype).contiguous(memory_format=torch.channels_last)
    got, want = getattr(embed, path)(x), embed.forward_native(x)
    assert got.shape == want.shape == ((2, 12, 72) if flatten else (2, 72, 3, 4)) and got.dtype == dtype
    torch.testing.assert_close(got.double(), want.double(), rtol=tol, atol=tol)


@pytest.mark.parametrize("patch, dim, height, width", [(14, 384, 56, 70), (16, 1024, 48, 32), (14, 1152, 48, 48)])
def test_native_is_timm_conv_in_float64(patch, dim, height, width):
    """timm's PatchEmbed state dict (``proj.weight`` [D, C, p, p], ``proj.bias``) loads strictly;
    tokens are its conv's output flattened row by row over the grid, in float64."""
    gen = torch.Generator().manual_seed(patch + dim)
    conv = nn.Conv2d(3, dim, patch, stride=patch).double()
    with torch.no_grad():
        conv.bias.copy_(torch.randn(dim, generator=gen, dtype=torch.float64))
    timm_state = {f"proj.{k}": v for k, v in conv.state_dict().items()}
    ours = PatchEmbed(img_size=224, patch_size=patch, in_chans=3, embed_dim=dim).double()
    ours.load_state_dict(timm_state, strict=True)
    x = torch.randn(2, 3, height, width, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(ours.forward_native(x), conv(x).flatten(2).transpose(1, 2), rtol=1e-12, atol=1e-12)
    grid = PatchEmbed(img_size=224, patch_size=patch, in_chans=3, embed_dim=dim, flatten=False).double()
    grid.load_state_dict(timm_state, strict=True)
    torch.testing.assert_close(grid.forward_native(x), conv(x), rtol=1e-12, atol=1e-12)


def test_grid_of_the_native_size_and_refused_images():
    assert PatchEmbed(img_size=384, patch_size=14, embed_dim=1152).num_patches == 27 * 27  # SigLIP so400m
    assert PatchEmbed(img_size=224, patch_size=16, embed_dim=1024).grid_size == (14, 14)  # DINOv3 ViT-L
    embed = PatchEmbed(img_size=224, patch_size=14, embed_dim=8)
    with pytest.raises(ValueError, match="no whole 14x14 patch"):
        embed(torch.zeros(1, 3, 13, 28))
    with pytest.raises(ValueError, match=r"expects images \[B, 3, H, W\]"):
        embed(torch.zeros(1, 4, 28, 28))


@pytest.mark.parametrize("tree", [EXAMPLES, ROOT / "kernels_reference"], ids=["examples", "reference-tree"])
def test_honest_candidates_pass_every_case(tree):
    assert_passes_every_case("patch_embed", tree)


@pytest.mark.parametrize("tree, failing", [
    # patch order, weight layout, bias (~4-10% of a token) and the token/channel transpose: every case
    ("patch_grid_column_major", lambda c: True),
    ("patch_weight_hwc_order", lambda c: True),
    ("patch_no_bias", lambda c: True),
    ("patch_reshape_not_transpose", lambda c: True),
    # only SigLIP's image is wider than its whole patches (48 px at 14, as 384 px is)
    ("patch_flat_crop", lambda c: c["width"] % c["patch"] != 0),
], ids=["grid-column-major", "weight-hwc-order", "no-bias", "reshape-not-transpose", "flat-crop"])
def test_wrong_candidates_fail_exactly_where_expected(tree, failing):
    assert_fails_exactly("patch_embed", tree, failing, some_pass=tree == "patch_flat_crop")


@pytest.mark.parametrize("tree, height, width", [
    ("patch_grid_column_major", 14, 42),  # a 1 x 3 grid: column by column is row by row
    ("patch_reshape_not_transpose", 14, 14),  # one patch: [B, D, 1] reshaped is [B, 1, D]
], ids=["grid-column-major", "reshape-not-transpose"])
def test_order_bugs_pass_where_the_order_cannot_show(tree, height, width):
    """The two order bugs are right on the images where the order is moot: their failures on the
    real cases are the order and nothing else."""
    task = get_task("patch_embed")
    case = task.image_case("dinov2-small", height, width, 2, torch.bfloat16)
    counts, _ = verdicts("patch_embed", load(CANDIDATES / tree, "patch_embed"), [case])
    assert counts == {status.PASSED: 1}


@pytest.mark.parametrize("task_name", ["siglip_vision_model", "dinov2_model", "dinov3_model"])
def test_a_bare_patch_embedding_composes_into_every_vision_tower(task_name):
    """The towers ask only the patch embedding's forward (its grid is theirs to work out): a candidate
    PatchEmbed without the reference's helpers gives the reference tower's output."""
    from fk_pytest.build import clone_inputs, instantiate, master_state
    from fk_pytest.candidates import CandidateSource
    from fk_pytest.compose import candidate_lookup, swap_children
    from fk_pytest.registry import all_tasks

    task = all_tasks()[task_name]
    case = task.cases("cpu")[0]
    state = master_state(task, case, seed=0)
    reference = instantiate(task.reference, task, case, state, "cpu", torch.float32)
    holder = torch.nn.Module()
    holder.model = instantiate(task.reference, task, case, state, "cpu", torch.float32)
    composition = swap_children(holder, candidate_lookup(CandidateSource(str(CANDIDATES / "patch_embed_bare"))))
    assert composition.swapped == ["PatchEmbed"] and not composition.failed
    inputs = {k: v.float() if torch.is_tensor(v) and v.is_floating_point() else v
              for k, v in task.make_inputs(case, torch.Generator().manual_seed(1), torch.device("cpu")).items()}
    with torch.no_grad():
        want = task.call(reference, clone_inputs(inputs))
        got = task.call(holder.model, clone_inputs(inputs))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
