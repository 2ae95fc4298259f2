"""The reference modules' Triton fast paths agree with their native definitions.

On a CPU machine the Triton kernels run in the interpreter, so CI checks the GPU code paths'
logic (strided rows, fused add, partial and interleaved rotary, in-place writes, the embedding gather) on small shapes.
"""
import copy

import pytest
import torch

from fk_pytest.compare import output_error
from kernels_reference.L1.rms_norm import RMSNorm
from kernels_reference.L1.rotary_emb import RotaryEmbedding
from kernels_reference.L1.silu_and_mul import SiluAndMul
from kernels_reference.L1.vocab_parallel_embedding import VocabParallelEmbedding

pytest.importorskip("triton")
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}


def _gen():
    return torch.Generator().manual_seed(0)


def _truths(module, *args):
    """forward_native in float64: the semantic definition, as the suite computes its truth."""
    m64 = copy.deepcopy(module).double()
    up = [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
    out = m64.forward_native(*up)
    return out if isinstance(out, tuple) else (out,)


def _agree(truth, native, fast):
    # Interpreted Triton truncates to bf16: allow for it as the suite does (truncating floor).
    assert fast.shape == native.shape and fast.dtype == native.dtype
    e = output_error("out", truth, [native], fast, native.dtype, truncating=True)
    assert e.passed(3.0), e


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["contiguous", "row-padded", "head-view"])
@pytest.mark.parametrize("fused", [False, True])
def test_rms_norm_triton(dtype, layout, fused):
    g = _gen()
    width = 128
    if layout == "head-view":
        x = torch.randn(5, 12 * width, generator=g)[:, 2 * width: 6 * width].view(5, 4, width)
    elif layout == "row-padded":
        x = torch.randn(9, width + 40, generator=g)[:, :width]
    else:
        x = torch.randn(9, width, generator=g)
    x = x.to(dtype)
    residual = torch.randn(x.shape, generator=g).to(dtype) if fused else None
    m = RMSNorm(width, 1e-6).to(dtype)
    with torch.no_grad():
        m.weight.copy_(torch.rand(width, generator=g) + 0.5)
        native, fast = m.forward_native(x, residual), m.forward_triton(x, residual)
    truths = _truths(m, x, residual)
    natives, fasts = ((native,), (fast,)) if not fused else (native, fast)
    for t, a, b in zip(truths, natives, fasts):
        _agree(t, a, b)


@pytest.mark.parametrize("width", [4096, 3584])  # one program per row: unmasked / masked columns
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("chunk", [0, 1024])  # the whole row at once / the looped two-pass form
def test_rms_norm_triton_wide_rows(width, fused, chunk):
    import triton

    from kernels_reference.L1.gemma_rms_norm import GemmaRMSNorm
    from kernels_reference.L1.rms_norm import rms_norm_rows

    g = _gen()
    x = torch.randn(3, width + 64, generator=g)[:, :width].to(torch.bfloat16)  # padded rows
    residual = torch.randn(3, width, generator=g).to(torch.bfloat16) if fused else None
    config = triton.Config({"ROWS": 1, "CHUNK": chunk}, num_warps=4)
    for m in (RMSNorm(width, 1e-5), GemmaRMSNorm(width, 1e-5)):
        m = m.to(torch.bfloat16)
        with torch.no_grad():
            m.weight.copy_(0.1 * torch.randn(width, generator=g) + (0 if isinstance(m, GemmaRMSNorm) else 1))
            native = m.forward_native(x, residual)
            fast = rms_norm_rows(m, x, residual, unit_offset=isinstance(m, GemmaRMSNorm), config=config)
        natives, fasts = ((native,), (fast,)) if not fused else (native, fast)
        for t, a, b in zip(_truths(m, x, residual), natives, fasts):
            _agree(t, a, b)


def test_silu_and_mul_triton_odd_width_and_strided_rows():
    x = torch.randn(7, 2 * 1500 + 16, generator=_gen())[:, : 2 * 1500]
    m = SiluAndMul()
    _agree(_truths(m, x)[0], m.forward_native(x), m.forward_triton(x))


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("rotary_dim", [128, 64])
def test_rope_triton_in_place_on_qkv_views(neox, rotary_dim):
    g = _gen()
    rope = RotaryEmbedding(128, rotary_dim, 131072, 500000.0, neox, LLAMA3)
    positions = torch.randint(0, 131072, (6,), generator=g)
    qkv = torch.randn(6, (4 + 2 * 2) * 128, generator=g)
    q, k = qkv[:, : 4 * 128], qkv[:, 4 * 128: 6 * 128]
    truth_q, truth_k = _truths(rope, positions, q, k)
    native_q, native_k = rope.forward_native(positions, q, k)
    v_before = qkv[:, 6 * 128:].clone()
    fast_q, fast_k = rope.forward_triton(positions, q, k)
    assert fast_q.data_ptr() == q.data_ptr()  # in place, as production
    assert torch.equal(qkv[:, 6 * 128:], v_before)  # the value part is untouched
    _agree(truth_q, native_q, fast_q)
    _agree(truth_k, native_k, fast_k)


def test_rope_rejects_unsupported_scaling():
    with pytest.raises(NotImplementedError, match="yarn"):
        RotaryEmbedding(128, 128, 4096, 10000.0, True, {"rope_type": "yarn", "factor": 4.0})


def test_llama3_scaling_changes_only_low_frequencies():
    plain = RotaryEmbedding(128, 128, 131072, 500000.0).inv_freq()
    scaled = RotaryEmbedding(128, 128, 131072, 500000.0, True, LLAMA3).inv_freq()
    assert torch.equal(plain[:8], scaled[:8])  # high frequencies kept
    assert torch.allclose(scaled[-4:], plain[-4:] / 8.0)  # low frequencies divided by the factor


@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("width", [96, 1000, 1030])
@pytest.mark.parametrize("n_tokens", [1, 37])
def test_embedding_triton_gathers_rows_exactly(id_dtype, width, n_tokens):
    g = _gen()
    m = VocabParallelEmbedding(300, width).to(torch.bfloat16)
    with torch.no_grad():
        m.weight.copy_(torch.randn(300, width, generator=g))
    ids = torch.randint(0, 300, (n_tokens,), generator=g).to(id_dtype)
    ids[0] = 299  # the table's last row: an off-by-one in the bounds check would zero it
    fast = m.forward_triton(ids)
    assert fast.dtype == torch.bfloat16 and fast.shape == (n_tokens, width)
    assert torch.equal(fast, m.forward_native(ids))  # a gather is a copy: bit-exact


def test_embedding_triton_keeps_id_shape_and_zeroes_out_of_range_ids():
    m = VocabParallelEmbedding(50, 64)
    with torch.no_grad():
        m.weight.copy_(torch.randn(50, 64, generator=_gen()) + 3.0)  # no zero rows by chance
    ids = torch.tensor([[3, 50, -1], [49, 7, 1000]])
    fast = m.forward_triton(ids)
    assert fast.shape == (2, 3, 64)
    valid = torch.tensor([[True, False, False], [True, True, False]])
    assert torch.equal(fast[valid], m.forward_native(ids.clamp(0, 49))[valid])
    assert torch.count_nonzero(fast[~valid]) == 0  # vLLM's masked lookup: ids outside give zeros


def test_embedding_triton_rejects_float_ids():
    with pytest.raises(TypeError, match="int32 or int64"):
        VocabParallelEmbedding(10, 8).forward_triton(torch.zeros(3))
