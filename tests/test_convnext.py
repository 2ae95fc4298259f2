"""ConvNeXt-V2 ops: GlobalResponseNorm's Triton path (interpreted, with the interpreter's tiling and
the GPU's split reduction) against its native definition; the native definitions against Hugging
Face's ConvNextV2GRN and ConvNextV2Layer (depthwise conv, channels-last LayerNorm) in float64 on
their state dicts, and against timm's GRN formula restated; the depthwise conv + LayerNorm's CUDA
path code (``F.conv2d`` on a channels-last input, run here on the CPU) against its native one; and
the two tasks' verdicts on the honest candidates and on four wrong ones."""
import pytest
import torch

from kernels_reference.L1.convnext_dwconv import ConvNeXtDwConvNorm
import kernels_reference.L1.grn as grn_mod
from kernels_reference.L1.grn import GlobalResponseNorm, Tiles, grn_channels_last, one_wave_splits, pixel_splits

from conftest import EXAMPLES, ROOT
from test_verdicts import assert_fails_exactly, assert_passes_every_case

triton = pytest.importorskip("triton")


def _grn(dim, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    grn = GlobalResponseNorm(dim)
    with torch.no_grad():
        grn.weight.copy_(0.5 * torch.randn(grn.weight.shape, generator=gen))
        grn.bias.copy_(0.1 * torch.randn(grn.bias.shape, generator=gen))
    return grn.to(dtype), gen


# The GPU's tiling on 15 pixels: four splits of 4, 4, 4 and 3 pixels (a partial row tile in the
# last), channel tiles of 16 and 32 that do not divide 40, and the mean over channels summed in
# chunks of 16.
GPU_TILES = Tiles(splits=4, reduce_rows=4, reduce_channels=16, apply_rows=4, apply_channels=32, warps=4,
                  stats_channels=16)
# A reduction tile wider than the channels (512 over 384 on the GPU): one channel block, its tail masked.
WIDE_TILES = GPU_TILES._replace(reduce_rows=8, reduce_channels=64)


@pytest.mark.parametrize("config", [None, GPU_TILES, WIDE_TILES], ids=["interpreter-tiles", "gpu-split", "gpu-wide"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grn_triton_matches_native(monkeypatch, dtype, config):
    """Two images of 5 x 3 pixels and 40 channels: partial channel and pixel tiles, and (gpu-split)
    each image's pixels summed by four programs per channel block into the partials."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    grn, gen = _grn(40, dtype)
    x = torch.nn.functional.gelu(1.5 * torch.randn(2, 5, 3, 40, generator=gen)).to(dtype)
    got, want = grn_channels_last(grn, x, config), grn.forward_native(x)
    assert got.shape == x.shape and got.dtype == dtype
    tol = 2e-5 if dtype == torch.float32 else 1.6e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    assert torch.equal(grn_channels_last(grn, x, config), got)  # no atomics: the same bits again
    # Where the factors are computed moves work between programs, never a value.
    for form in ("recompute", "factor-launch"):
        assert torch.equal(grn_channels_last(grn, x, config, form=form), got), form


@pytest.mark.parametrize("batch, side, form", [(1, 56, "factor-launch"), (1, 28, "recompute"),
                                              (2, 56, "factor-launch"), (2, 28, "recompute")])
def test_grn_by_shape_picks_the_form_that_timed_fastest(monkeypatch, batch, side, form):
    """The shipped form: for maps of 56 x 56 pixels or more the factor launch, for one image or a
    batch (where it timed fastest on an H100), recompute for smaller maps."""
    used = []
    factor_kernel = grn_mod._grn_factor_kernel
    monkeypatch.setattr(grn_mod, "_grn_factor_kernel", _Recording(factor_kernel, used, "factor-launch"))
    monkeypatch.setattr(grn_mod, "FORM", "by-shape")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    grn, gen = _grn(8, torch.float32)
    x = torch.randn(batch, side, side, 8, generator=gen)
    out = grn_channels_last(grn, x)
    assert used == ([form] if form != "recompute" else [])
    torch.testing.assert_close(out, grn.forward_native(x), rtol=2e-5, atol=2e-5)


class _Recording:
    """A kernel launcher that notes its use, then launches."""

    def __init__(self, kernel, log, name):
        self.kernel, self.log, self.name = kernel, log, name

    def __getitem__(self, grid):
        self.log.append(self.name)
        return self.kernel[grid]


def test_grn_names_an_unknown_form():
    grn, gen = _grn(8, torch.float32)
    with pytest.raises(ValueError, match="'atomics' is not one of"):
        grn_channels_last(grn, torch.randn(1, 2, 2, 8, generator=gen), form="atomics")


@pytest.mark.parametrize("batch, side, channels", [(32, 56, 384), (32, 14, 1536), (1, 56, 384), (1, 7, 3072)])
def test_grn_gpu_splits_fill_the_gpu_with_small_partials(batch, side, channels):
    """ConvNeXt-V2-Tiny's maps on 132 SMs: the reduction gets at least 4 programs an SM of 64
    channels (or every pixel split it may have), and an image's partials stay at most 16 KB."""
    splits = pixel_splits(batch, side * side, channels, 132)
    assert 1 <= splits and splits * channels <= 4096
    programs = batch * splits * -(-channels // 64)
    assert programs >= 4 * 132 or splits == min(-(-side * side // 32), 4096 // channels)


@pytest.mark.parametrize("batch, pixels, resident, expected", [
    (32, 3136, 3, 2),   # stage 1, batch 32: 32 x 6 channel blocks x 2 splits = 384 programs of 396 places
    (64, 3136, 3, 1),   # more pairs than places: one split each (1.9 waves, no fewer possible)
    (8, 3136, 3, 8),    # 48 pairs: 8 splits fill 384 of 396
    (4, 3136, 3, 8),    # room for 16: capped at ONE_WAVE_MAX_SPLITS
    (1, 3136, 3, 8),    # one image: capped too
    (1, 64, 3, 2),      # a small map: no split shorter than 32 pixels
    (32, 3136, None, 1),  # residency unknown: one program an SM assumed
])
def test_grn_one_wave_splits_fill_one_wave(batch, pixels, resident, expected):
    """The factor launch's reduction gets as many pixel splits as keep its programs within one wave
    of resident programs on 132 SMs (timed fastest at 0.9-0.97 waves and slower past one, H100)."""
    splits = one_wave_splits(batch, pixels, 384, 64, 132, resident)
    assert splits == expected
    if splits > 1 and resident:
        assert batch * 6 * splits <= 132 * resident


class _FixedApply:
    """Stands in for the autotuned apply launch in the interpreter: one small tile."""

    def __getitem__(self, grid):
        meta = dict(BLOCK_R=16, BLOCK_C=8)
        return lambda *args, **consts: grn_mod._grn_apply_kernel[grid(meta)](*args, **consts, **meta)


def test_grn_factor_launch_one_wave_path_matches_native(monkeypatch):
    """The GPU's factor-launch path (reduction planned for one wave, not autotuned), run in the
    interpreter at a small shape: the splits it plans reach the launch and the output is the
    definition's."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(grn_mod, "autotune_here", lambda x: True)
    monkeypatch.setattr(grn_mod, "sm_count", lambda device: 3)
    monkeypatch.setattr(grn_mod, "reduction_residency", lambda x, *tile: 2)
    monkeypatch.setattr(grn_mod, "ONE_WAVE_REDUCE", (16, 8, 1))
    monkeypatch.setattr(grn_mod, "_tuned_apply", lambda: _FixedApply())
    grids = []
    launch = grn_mod._grn_sumsq_kernel
    monkeypatch.setattr(grn_mod, "_grn_sumsq_kernel", type("Rec", (), {
        "__getitem__": lambda self, grid: grids.append(grid) or launch[grid]})())
    grn, gen = _grn(16, torch.float32)
    x = torch.randn(2, 12, 12, 16, generator=gen)
    out = grn_channels_last(grn, x, form="factor-launch")
    # 2 images x 2 channel blocks = 4 pairs; 3 SMs x 2 resident = 6 places: 1 split
    assert grids == [(2 * 1, 2)]
    torch.testing.assert_close(out, grn.forward_native(x), rtol=2e-5, atol=2e-5)
    # 24 places: 6 splits a pair, capped at 5 (none shorter than 32 of the 144 pixels)
    monkeypatch.setattr(grn_mod, "reduction_residency", lambda x, *tile: 8)
    out = grn_channels_last(grn, x, form="factor-launch")
    assert grids[-1] == (2 * 5, 2)
    torch.testing.assert_close(out, grn.forward_native(x), rtol=2e-5, atol=2e-5)


def test_grn_native_is_hf_and_timm_in_float64():
    """HF's ConvNextV2GRN state dict (``weight`` / ``bias`` [1, 1, 1, C]) loads strictly and gives
    the same values; timm's form ``addcmul(bias, weight * Nx + 1, x)`` (restated here, timm is not
    a dependency) is the same op: eps added to the mean of the norms in both."""
    from transformers.models.convnextv2.modeling_convnextv2 import ConvNextV2GRN

    gen = torch.Generator().manual_seed(3)
    hf = ConvNextV2GRN(96).double()
    with torch.no_grad():
        hf.weight.copy_(torch.randn(hf.weight.shape, generator=gen))
        hf.bias.copy_(torch.randn(hf.bias.shape, generator=gen))
    ours = GlobalResponseNorm(96).double()
    ours.load_state_dict(hf.state_dict(), strict=True)
    x = torch.nn.functional.gelu(torch.randn(2, 7, 5, 96, generator=gen, dtype=torch.float64))
    want = ours.forward_native(x)
    torch.testing.assert_close(want, hf(x), rtol=1e-12, atol=1e-12)
    x_g = x.norm(p=2, dim=(1, 2), keepdim=True)
    timm_form = torch.addcmul(ours.bias, ours.weight * (x_g / (x_g.mean(dim=-1, keepdim=True) + 1e-6)) + 1, x)
    torch.testing.assert_close(want, timm_form, rtol=1e-12, atol=1e-12)
    channels_first = GlobalResponseNorm(96, channels_last=False).double()
    channels_first.load_state_dict({k: v.permute(0, 3, 1, 2) for k, v in hf.state_dict().items()}, strict=True)
    torch.testing.assert_close(channels_first(x.permute(0, 3, 1, 2)), want.permute(0, 3, 1, 2), rtol=1e-12, atol=1e-12)


def test_dwconv_norm_native_is_hf_layer_in_float64():
    """HF's ConvNextV2Layer's first half (``dwconv``, permute, ``layernorm``) with its keys renamed
    to timm's (``conv_dw``, ``norm``) loads strictly and matches in float64, NCHW and channels-last."""
    from transformers import ConvNextV2Config
    from transformers.models.convnextv2.modeling_convnextv2 import ConvNextV2Layer

    gen = torch.Generator().manual_seed(5)
    layer = ConvNextV2Layer(ConvNextV2Config(), dim=48).double()
    with torch.no_grad():
        for p in list(layer.dwconv.parameters()) + list(layer.layernorm.parameters()):
            p.copy_(torch.randn(p.shape, generator=gen))
    state = {f"conv_dw.{k}": v for k, v in layer.dwconv.state_dict().items()}
    state.update({f"norm.{k}": v for k, v in layer.layernorm.state_dict().items()})
    ours = ConvNeXtDwConvNorm(48).double()
    ours.load_state_dict(state, strict=True)
    x = torch.randn(2, 48, 9, 6, generator=gen, dtype=torch.float64)
    want = layer.layernorm(layer.dwconv(x).permute(0, 2, 3, 1))
    torch.testing.assert_close(ours.forward_native(x), want, rtol=1e-12, atol=1e-12)
    got = ours.forward_native(x.contiguous(memory_format=torch.channels_last))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert got.is_contiguous()


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)], ids=["fp64", "fp32"])
def test_dwconv_norm_cudnn_path_matches_native(dtype, tol):
    """The CUDA path's code (channels-last ``F.conv2d``, the permuted output into the LayerNorm
    module) on a 2 x 40 x 5 x 8 map smaller than the kernel on one side; a packed [B, H, W, C] out."""
    gen = torch.Generator().manual_seed(9)
    mod = ConvNeXtDwConvNorm(40)
    with torch.no_grad():
        for p in mod.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    mod = mod.to(dtype)
    x = torch.randn(2, 40, 5, 8, generator=gen).to(dtype)
    got, want = mod.forward_cudnn(x), mod.forward_native(x)
    assert got.shape == (2, 5, 8, 40) and got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("task_name", ["global_response_norm", "convnext_dwconv_norm"])
@pytest.mark.parametrize("tree", [EXAMPLES, ROOT / "kernels_reference"], ids=["examples-triton", "reference-tree"])
def test_honest_candidates_pass_every_case(tree, task_name):
    assert_passes_every_case(task_name, tree)


@pytest.mark.parametrize("tree, task_name, failing", [
    # per-channel norms differ several times over the map; per-pixel norms over channels do not
    ("grn_channel_norm", "global_response_norm", lambda c: True),
    # the residual is the bulk of the output
    ("grn_no_residual", "global_response_norm", lambda c: True),
    # a one-pixel shift of correlated maps, on every map larger than one pixel
    ("dwconv_shifted_padding", "convnext_dwconv_norm", lambda c: True),
    # only a channels-last input has other strides than packed NCHW
    ("dwconv_nchw_strides", "convnext_dwconv_norm", lambda c: c["layout"] == "channels-last"),
], ids=["grn-channel-norm", "grn-no-residual", "dwconv-shifted-padding", "dwconv-nchw-strides"])
def test_wrong_candidates_fail_exactly_where_expected(tree, task_name, failing):
    assert_fails_exactly(task_name, tree, failing, some_pass=tree == "dwconv_nchw_strides")
