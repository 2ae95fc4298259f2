"""ConvNeXt-V2's block (L3) and model (L4): the GPU path's code run on the CPU (the Triton kernels
interpreted, PatchEmbed's GEMM, the channels-last depthwise convolution) against the native path,
with the feature maps kept in channels-last memory; the tasks' verdicts on the honest example tree
and on wrong candidates, each failing exactly where expected. Agreement with Hugging Face (and timm)
is tests/test_hf_convnext.py."""
import pytest
import torch

from fk_pytest.build import with_paths
from kernels_reference.L4.convnext import ConvNextV2Model

from conftest import EXAMPLES
from test_verdicts import assert_fails_exactly, assert_passes_every_case

pytest.importorskip("triton")

TINY = dict(hidden_sizes=[16, 24, 40, 48], depths=[1, 1, 2, 1], layer_norm_eps=1e-6)
FAST_PATHS = {"forward_triton": ["LayerNorm", "GELU", "GlobalResponseNorm"], "forward_gemm": ["PatchEmbed"],
              "forward_cudnn": ["ConvNeXtDwConvNorm"]}


def test_gpu_path_code_matches_native(monkeypatch):
    """bf16, a 70 x 54 px pair: every child on its CUDA path's code except the cuBLAS GEMMs (the
    same F.linear on both sides), through the permuted and strided views the model hands them."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    gen = torch.Generator().manual_seed(0)
    model = ConvNextV2Model(TINY)
    with torch.no_grad():
        for p in model.parameters():
            fan_in = p[0].numel() if p.dim() >= 2 else 0
            p.copy_(torch.randn(p.shape, generator=gen) * (fan_in ** -0.5 if fan_in else 0.5))
    model = model.to(torch.bfloat16).eval()
    fast = model
    for method, classes in FAST_PATHS.items():
        fast = with_paths(fast, method, classes)
    pixels = torch.randn(2, 3, 70, 54, generator=gen).to(torch.bfloat16)
    with torch.no_grad():
        want = model.forward_native(pixels)
        got = fast(pixels)
    assert got[0].shape == (2, 48, 2, 1) and got[1].shape == (2, 48)
    assert got[0].is_contiguous(memory_format=torch.channels_last)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.float(), w.float(), rtol=0.05, atol=0.05)


@pytest.mark.parametrize("task_name", ["convnext_block", "convnext_model"])
def test_honest_example_candidates_pass_every_case(task_name):
    assert_passes_every_case(task_name, EXAMPLES)


@pytest.mark.parametrize("task_name, tree, failing", [
    # the shortcut is as large as the branch on every map
    ("convnext_block", "convnext_block_no_residual", lambda c: True),
    # only a packed NCHW input has other strides than channels-last
    ("convnext_block", "convnext_block_reads_channels_last", lambda c: c["layout"] == "contiguous"),
    # every downsampling layer's taps meet the wrong weights
    ("convnext_model", "convnext_downsample_patch_order", lambda c: True),
    # GRN rescales the last stage's hidden features on every map, a one-pixel map included
    ("convnext_model", "convnext_last_stage_no_grn", lambda c: True),
], ids=["block-no-residual", "block-reads-channels-last", "model-downsample-patch-order", "model-last-stage-no-grn"])
def test_wrong_candidates_fail_exactly_where_expected(task_name, tree, failing):
    assert_fails_exactly(task_name, tree, failing, some_pass=tree == "convnext_block_reads_channels_last")
