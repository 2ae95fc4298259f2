"""The engine's fused batch-1 decode (``LLM(..., fused_decode=True)``): its two kernels against the
unfused computation they replace, the engine's greedy tokens and caches with and without it, and
the refusals that keep it off models it does not describe. On a CPU the kernels run in Triton's
interpreter, in float32 (its bfloat16 conversions truncate, so bit-level checks use float32); on
a GPU the kernel checks run in bfloat16 and the engine checks in float32 (``bash benchmarks/gpu_steps.sh
fused-tests``)."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")
transformers = pytest.importorskip("transformers")

from kernels_reference.ops.fused_gemv import gemv as fused_gemv  # noqa: E402
from kernels_reference.ops import paged_decode as decode  # noqa: E402
from kernels_reference.engine import LLM, SamplingParams  # noqa: E402
from kernels_reference.engine.fused_decode import FusedDecode, FusedDecodeConfig, fused_decode_unavailable_reason  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32
TOL = 2e-2 if DTYPE == torch.bfloat16 else 1e-5


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def _rows(*shapes, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=gen).to(DEVICE, DTYPE) for s in shapes]


@pytest.mark.parametrize("with_residual", [False, True])
def test_norm_gemv_silu_mul_matches_the_unfused_modules(with_residual):
    hidden, inter = 64, 48
    x, res, w = _rows((1, hidden), (1, hidden), (2 * inter, hidden))
    norm_w = 1 + 0.1 * _rows((hidden,), seed=1)[0]
    residual = res if with_residual else None
    got, got_res = fused_gemv.norm_gemv_silu_mul(x, residual, norm_w, 1e-5, w)
    want, want_res = fused_gemv.norm_gemv_silu_mul_reference(x, residual, norm_w, 1e-5, w)
    assert got.shape == (1, inter) and _rel(got, want) < TOL
    assert _rel(got_res, want_res) < TOL and (with_residual or got_res is x)


@pytest.mark.parametrize("slot", [6, -1])
def test_norm_gemv_rope_kv_rotates_and_stores_like_the_unfused_modules(slot):
    nq, nk, d, hidden = 4, 2, 32, 64
    x, res, w = _rows((1, hidden), (1, hidden), ((nq + 2 * nk) * d, hidden))
    norm_w = 1 + 0.1 * _rows((hidden,), seed=1)[0]
    table = _rows((10, d), seed=2)[0].float()
    row, slots = torch.tensor([3], device=DEVICE), torch.tensor([slot], device=DEVICE)
    caches = [torch.randn(5, 4, nk, d, generator=torch.Generator().manual_seed(3)).to(DEVICE, DTYPE) for _ in range(2)]
    ref_caches = [c.clone() for c in caches]
    query, new_res = fused_gemv.norm_gemv_rope_kv(x, res, norm_w, 1e-6, w, table, row, slots, *caches, nq, nk, d)
    want_q, want_res = fused_gemv.norm_gemv_rope_kv_reference(x, res, norm_w, 1e-6, w, table, row, slots,
                                                              *ref_caches, nq, nk, d)
    assert _rel(query, want_q) < TOL and _rel(new_res, want_res) < TOL
    for got, want in zip(caches, ref_caches):
        assert _rel(got, want) < TOL
    if slot < 0:  # a padding row stores nothing
        fresh = torch.randn(5, 4, nk, d, generator=torch.Generator().manual_seed(3)).to(DEVICE, DTYPE)
        assert torch.equal(caches[0], fresh)
    else:  # the slot's row (block 1, offset 2) was overwritten, in both caches
        fresh = torch.randn(5, 4, nk, d, generator=torch.Generator().manual_seed(3)).to(DEVICE, DTYPE)
        assert not torch.equal(caches[0][1, 2], fresh[1, 2]) and not torch.equal(caches[1][1, 2], fresh[1, 2])


@pytest.mark.parametrize("row_acc,half,per_sm,tma,extra", [
    (True, None, None, False, {}), (False, 4, None, False, {}), (False, 16, None, False, {}),
    (True, 4, 1, False, {}), (False, None, 2, False, {}), (True, 8, 2, True, {}),
    (True, 4, 1, False, dict(NORM_BLOCK=128)), (False, None, 2, False, dict(NORM_BLOCK=32)),
    (True, 4, None, False, dict(STAGES=3, NORM_BLOCK=16)), (True, None, 2, False, dict(LATE_TRIGGER=True))])
def test_fused_kernel_loop_variants_agree(monkeypatch, row_acc, half, per_sm, tma, extra):
    """The GPU tile options (per-row accumulators, rows per program, a persistent grid of a few
    programs per SM that loop over the row groups, weights through a TMA descriptor, the norm
    statistics in steps of other sizes, the loop's loads pipelined STAGES deep, the next kernel
    launched only after the last weights) over several loop iterations with a ragged last tile
    (72 columns in tiles of 16). The kernels run as dependent launches where the GPU has them;
    in the interpreter without."""
    monkeypatch.setattr(fused_gemv, "_config", lambda k, on_gpu, epilogue=None: {**dict(
        BLOCK_K=16, num_warps=4, ROW_ACC=row_acc, HALF=half, PER_SM=per_sm, TMA=tma, STAGES=3 if tma else 1), **extra})
    pdl = DEVICE == "cuda" and decode.pdl_unavailable_reason(torch.device(DEVICE)) is None
    hidden, inter, nq, nk, d = 72, 48, 4, 2, 32
    x, res, w, wq = _rows((1, hidden), (1, hidden), (2 * inter, hidden), ((nq + 2 * nk) * d, hidden))
    norm_w = 1 + 0.1 * _rows((hidden,), seed=1)[0]
    got = fused_gemv.norm_gemv_silu_mul(x, res, norm_w, 1e-5, w, pdl=pdl)
    want = fused_gemv.norm_gemv_silu_mul_reference(x, res, norm_w, 1e-5, w)
    assert _rel(got[0], want[0]) < TOL and _rel(got[1], want[1]) < TOL
    table = _rows((10, d), seed=2)[0].float()
    row, slots = torch.tensor([3], device=DEVICE), torch.tensor([6], device=DEVICE)
    caches = [torch.zeros(5, 4, nk, d, device=DEVICE, dtype=DTYPE) for _ in range(2)]
    ref = [c.clone() for c in caches]
    q, _ = fused_gemv.norm_gemv_rope_kv(x, None, norm_w, 1e-6, wq, table, row, slots, *caches, nq, nk, d, pdl=pdl)
    q_ref, _ = fused_gemv.norm_gemv_rope_kv_reference(x, None, norm_w, 1e-6, wq, table, row, slots, *ref, nq, nk, d)
    assert _rel(q, q_ref) < TOL and all(_rel(a, b) < TOL for a, b in zip(caches, ref))
    w_o, act_in = _rows((32, hidden), (1, 2 * hidden), seed=4)
    assert _rel(fused_gemv.gemv(x, w_o, pdl=pdl), torch.nn.functional.linear(x, w_o)) < TOL
    assert _rel(fused_gemv.gemv(act_in, w_o, pdl=pdl, silu_mul_input=True),
                fused_gemv.gemv_reference(act_in, w_o, silu_mul_input=True)) < TOL


def test_gemv_matches_linear_and_the_fused_config_is_checked():
    x, w, gate_up = _rows((1, 72), (40, 72), (1, 144))
    assert _rel(fused_gemv.gemv(x, w), torch.nn.functional.linear(x, w)) < TOL
    got = fused_gemv.gemv(gate_up, w, silu_mul_input=True)
    assert _rel(got, fused_gemv.gemv_reference(gate_up, w, silu_mul_input=True)) < TOL
    assert _rel(got, torch.nn.functional.linear(gate_up[:, :72], w)) > 0.1  # the activation was applied
    with pytest.raises(ValueError, match="gate_up='cublas'"):
        FusedDecodeConfig(linear=False, gate_up="cublas")
    with pytest.raises(ValueError, match="multiple of 8 rows"):
        fused_gemv.gemv(x, w[:36])
    with pytest.raises(ValueError, match="needs linear=True"):
        FusedDecodeConfig(linear=False, pdl=True)
    with pytest.raises(ValueError, match="bool or a FusedDecodeConfig"):
        LLM(_tiny(), num_blocks=16, block_size=4, padded_decode=True, fused_decode="attention")


def test_fused_kernels_refuse_shapes_they_do_not_cover():
    x, w = _rows((2, 64), (96, 64))
    with pytest.raises(ValueError, match="one token"):
        fused_gemv.norm_gemv_silu_mul(x, None, torch.ones(64, device=DEVICE, dtype=DTYPE), 1e-6, w)
    x = x[:1]
    with pytest.raises(ValueError, match="do not fit"):
        fused_gemv.norm_gemv_silu_mul(x, None, torch.ones(32, device=DEVICE, dtype=DTYPE), 1e-6, w)


def _tiny(arch="llama", dtype=torch.float32):
    from test_hf_llama import CONFIGS
    from kernels_reference.L4.llama import model_for

    torch.manual_seed(0)
    model = model_for(CONFIGS[arch]())
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.dim() == 1 else 0.0))
    # float32 on every device (the GPU's F.linear without TF32 by default): the engine's tokens must
    # then match the module path's exactly, which bfloat16's rounding noise would not guarantee.
    return model.to(DEVICE, dtype)


# A 12-token prompt (chunked: the token budget is 8; its decode steps start a new block of 4 at
# position 12 and cross into the next one) and a one-token prompt (its prefill is a fused step).
# Under the CPU's Triton interpreter a fused step costs ~1.7 s (2026-12-03): 9 of them per engine
# cover those cases; 22 (three prompts, 8 tokens) cost 40-90 s per configuration.
PROMPTS = [[60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71], [7]]
ENGINE_TOKENS = 5
# The engines' block tables are 8 blocks wide (max_model_len 32 >= the 17 tokens of the longer
# sequence): the fused step's attention then runs 2 splits (its split and merge kernels, as at the
# default width) instead of the 8 mostly empty ones a 64-block table gets on the interpreter's 4 SMs.
ENGINE_LEN = 32


@pytest.mark.parametrize("config", [True, FusedDecodeConfig(mlp=False, linear=False),
                                    FusedDecodeConfig(linear=False, pdl=False), FusedDecodeConfig(pdl=True),
                                    FusedDecodeConfig(pdl=True, gate_up="cublas")],
                         ids=["default", "attention-side", "cublas-o-down", "pdl", "cublas-gate-up"])
def test_engine_with_fused_decode_gives_the_same_tokens_and_cache(config):
    model = _tiny()
    params = SamplingParams(max_tokens=ENGINE_TOKENS)
    plain = LLM(model, num_blocks=64, block_size=4, max_num_batched_tokens=8, padded_decode=True, max_num_seqs=4,
                max_model_len=ENGINE_LEN)
    want = [plain.generate([p], params)[0] for p in PROMPTS]
    want_cache = [c[:64].clone() for layer in model.model.layers for c in layer.self_attn.attn.kv_cache]
    fused = LLM(model, num_blocks=64, block_size=4, max_num_batched_tokens=8, padded_decode=True, max_num_seqs=4,
                max_model_len=ENGINE_LEN, fused_decode=config)
    calls = []
    forward_one = FusedDecode.forward_one

    def spy(self, *args):
        calls.append(1)
        return forward_one(self, *args)

    FusedDecode.forward_one = spy
    try:
        got = [fused.generate([p], params)[0] for p in PROMPTS]
        got_cache = [c[:64].clone() for layer in model.model.layers for c in layer.self_attn.attn.kv_cache]
        fused_steps = len(calls)
        both = fused.generate(PROMPTS[:2], params)  # batch 2: the module path, same tokens
    finally:
        FusedDecode.forward_one = forward_one
    assert got == want and both == want[:2]
    # Every one-token step of one sequence was fused (decode steps, and the one-token prompt's
    # prefill, which is the same computation); the batch-2 steps were not.
    one_token_steps = sum(params.max_tokens - 1 + (len(p) == 1) for p in PROMPTS)
    assert fused_steps == one_token_steps == len(calls)
    # The same calls in the same order: the engines handed out the same blocks, which hold the same values.
    assert max(_rel(g, w) for g, w in zip(got_cache, want_cache)) < 1e-4  # float32 throughout


def test_fused_decode_is_refused_with_the_reason_for_other_models():
    from kernels_reference.L1.rms_norm import RMSNorm

    class MyNorm(RMSNorm):
        pass

    model = _tiny()
    model.allocate_kv_cache(8, 4)
    assert fused_decode_unavailable_reason(model) is None
    layer = model.model.layers[1]
    layer.post_attention_layernorm.__class__ = MyNorm
    with pytest.raises(ValueError, match=r"model\.layers\.1\.post_attention_layernorm is MyNorm, not the reference RMSNorm"):
        LLM(model, num_blocks=16, block_size=4, padded_decode=True, fused_decode=True)
    layer.post_attention_layernorm.__class__ = RMSNorm
    model.model.layers[0].mlp = torch.nn.Identity()
    assert "model.layers.0.mlp is Identity" in fused_decode_unavailable_reason(model)
    for arch, reason in (("qwen3", "q/k norms"), ("qwen2", "biases")):
        other = _tiny(arch)
        other.allocate_kv_cache(8, 4)
        assert reason in fused_decode_unavailable_reason(other)
    with pytest.raises(ValueError, match="padded decode path"):
        LLM(_tiny(), num_blocks=16, block_size=4, fused_decode=True)
