"""LayerNorm: the reference's Triton kernel (interpreted) against its native definition, the native
definition against torch's LayerNorm in float64, and the task's verdicts on the honest candidates
and on four wrong ones, each failing exactly on the cases that can see its bug."""
import pytest
import torch

from kernels_reference.L1.layer_norm import LayerNorm

from conftest import EXAMPLES, ROOT
from test_verdicts import assert_fails_exactly, assert_passes_every_case

triton = pytest.importorskip("triton")


def _norm(hidden, eps, dtype=torch.float32, seed=0, **kw):
    gen = torch.Generator().manual_seed(seed)
    norm = LayerNorm(hidden, eps=eps, **kw)
    with torch.no_grad():
        if norm.weight is not None:
            norm.weight.copy_(1 + 0.3 * torch.randn(hidden, generator=gen))
        if norm.bias is not None:
            norm.bias.copy_(0.2 * torch.randn(hidden, generator=gen))
    return norm.to(dtype), gen


@pytest.mark.parametrize("hidden, eps, kw", [(384, 1e-12, {}), (1152, 1e-6, {}), (200, 1e-5, {"bias": False}),
                                             (96, 1e-5, {"elementwise_affine": False})])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_matches_native(monkeypatch, hidden, eps, kw, dtype):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    norm, gen = _norm(hidden, eps, dtype, seed=hidden, **kw)
    # 33 rows of a wider buffer (strided rows, a partial row tile), a mean far from zero (the
    # cancellation a one-pass E[x^2] - E[x]^2 would suffer), and a [B, T, H] residual.
    x = (3.0 + torch.randn(33, hidden + 24, generator=gen)).to(dtype)[:, 8: 8 + hidden]
    residual = torch.randn(3, 11, hidden, generator=gen).to(dtype)
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    got, want = norm.forward_triton(x), norm.forward_native(x)
    assert got.shape == x.shape and got.dtype == dtype and got.is_contiguous()
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    x3 = x.reshape(3, 11, hidden)
    (out, new_res), (want_out, want_res) = norm.forward_triton(x3, residual), norm.forward_native(x3, residual)
    assert out.shape == new_res.shape == x3.shape
    # the same float32 sum, one rounding (the interpreter's bf16 cast may round the other way: 1 ulp)
    ulp = 0 if dtype == torch.float32 else 2.0 ** -7
    torch.testing.assert_close(new_res.float(), want_res.float(), rtol=ulp, atol=0)
    torch.testing.assert_close(out.float(), want_out.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("hidden, eps", [(384, 1e-12), (1024, 1e-5), (1152, 1e-6)])
def test_native_is_torch_layer_norm_in_float64(hidden, eps):
    """The semantic definition is nn.LayerNorm: same parameters (a HF state dict loads strictly),
    same values in float64, the fused form is LayerNorm(x + residual) returning the sum."""
    gen = torch.Generator().manual_seed(7)
    torch_ln = torch.nn.LayerNorm(hidden, eps=eps).double()
    with torch.no_grad():
        torch_ln.weight.copy_(1 + 0.3 * torch.randn(hidden, generator=gen))
        torch_ln.bias.copy_(0.2 * torch.randn(hidden, generator=gen))
    ours = LayerNorm(hidden, eps=eps).double()
    ours.load_state_dict(torch_ln.state_dict(), strict=True)
    x = 2.0 + 3.0 * torch.randn(5, 9, hidden, generator=gen, dtype=torch.float64)
    r = torch.randn(5, 9, hidden, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(ours.forward_native(x), torch_ln(x), rtol=1e-12, atol=1e-12)
    out, new_res = ours.forward_native(x, r)
    torch.testing.assert_close(new_res, x + r, rtol=0, atol=0)
    torch.testing.assert_close(out, torch_ln(x + r), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("tree", [EXAMPLES, ROOT / "kernels_reference"], ids=["examples-triton", "reference-tree"])
def test_honest_candidates_pass_every_case(tree):
    assert_passes_every_case("layer_norm", tree)


@pytest.mark.parametrize("tree, failing", [
    # a bias of std 0.1 is ~40x the bf16 bar everywhere
    ("ln_no_bias", lambda c: True),
    # 1/(2N) relative (1e-3 at 384 wide) hides under bf16 rounding; float32 sees it
    ("ln_unbiased_variance", lambda c: c.dtype == torch.float32),
    # only the fused form returns a residual
    ("ln_old_residual", lambda c: c["variant"] == "fused-add"),
    # ~eps/2 relative: only float32 with BGE-M3's eps 1e-5 clears the 1e-6 float32 floor
    ("ln_eps_outside_sqrt", lambda c: c.dtype == torch.float32 and c["eps"] >= 1e-5),
], ids=["no-bias", "unbiased-variance", "old-residual", "eps-outside-sqrt"])
def test_wrong_candidates_fail_exactly_where_expected(tree, failing):
    assert_fails_exactly("layer_norm", tree, failing, some_pass=tree != "ln_no_bias")
