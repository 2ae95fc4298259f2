"""Qwen3-Next's modules against HF transformers' (same weights, same inputs)."""
import pytest
import torch

from kernels_reference.L1.gemma_rms_norm import GemmaRMSNorm

modeling = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemma_rms_norm_is_hf_qwen3_next_rms_norm(dtype):
    gen = torch.Generator().manual_seed(0)
    ours, hf = GemmaRMSNorm(256, eps=1e-6), modeling.Qwen3NextRMSNorm(256, eps=1e-6)
    with torch.no_grad():
        hf.weight.copy_(0.2 * torch.randn(256, generator=gen))
    ours.load_state_dict(hf.state_dict())  # the checkpoint's zero-centred weight, as stored
    ours, hf = ours.to(dtype), hf.to(dtype)
    x = torch.randn(5, 3, 256, generator=gen).to(dtype)
    torch.testing.assert_close(ours.forward_native(x), hf(x), rtol=0, atol=0)
