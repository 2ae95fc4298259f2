"""Triton kernel of Qwen3-Next's delta-rule gates, read straight from the ``in_proj_ba`` output.

The projection stores, per key head, its value heads' ``[b (r) | a (r)]`` (r = Hv / Hk). Unpacking
that layout, then sigmoid, softplus and the decay are five small elementwise launches in PyTorch;
here one program per tile of tokens reads each row's 2 * Hv values once (the group interleave is
index arithmetic) and writes ``g = -exp(A_log) * softplus(a + dt_bias)`` in float32 (a half g would
round the decay of fast heads) and ``beta = sigmoid(b)`` in the activation dtype, as vLLM's gating
kernel does. All arithmetic in float32.
"""
from typing import Tuple

import torch

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

from ...triton_rows import interpreting

SOFTPLUS_LINEAR_ABOVE = 20.0  # torch's softplus threshold: above it softplus(x) == x in float32


def gdn_gating(ba: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor,
               num_k_heads: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """ba [T, 2 * Hv] (rows may be strided, channels contiguous) -> (g [T, Hv] float32, beta [T, Hv])."""
    if ba.stride(-1) != 1:
        ba = ba.contiguous()
    tokens, hv = ba.shape[0], ba.shape[1] // 2
    g = torch.empty((tokens, hv), dtype=torch.float32, device=ba.device)
    beta = torch.empty((tokens, hv), dtype=ba.dtype, device=ba.device)
    if tokens == 0:
        return g, beta
    heads = triton.next_power_of_2(hv)
    # A GPU tile of ~4K gates keeps a decode batch in one program and a long prefill in many; the
    # interpreter pays per program, so it takes every token at once.
    rows = (max(1, 4096 // heads) if ba.is_cuda and not interpreting()
            else triton.next_power_of_2(tokens))
    rows = min(rows, triton.next_power_of_2(tokens))
    _gdn_gating_kernel[(triton.cdiv(tokens, rows),)](
        ba, a_log, dt_bias, g, beta, tokens, ba.stride(0), HV=hv, SHARE=hv // num_k_heads,
        BLOCK_T=rows, BLOCK_H=heads, LINEAR_ABOVE=SOFTPLUS_LINEAR_ABOVE)
    return g, beta


if triton is not None:

    @triton.jit
    def _gdn_gating_kernel(ba_ptr, a_log_ptr, dt_bias_ptr, g_ptr, beta_ptr, n_tokens, s_ba,
                           HV: tl.constexpr, SHARE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
                           LINEAR_ABOVE: tl.constexpr):
        tok = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
        head = tl.arange(0, BLOCK_H)
        # value head h is the (h % SHARE)-th of key head h // SHARE, whose group is [b | a], 2 * SHARE wide
        col_b = (head // SHARE) * (2 * SHARE) + head % SHARE
        head_ok = head < HV
        mask = (tok < n_tokens)[:, None] & head_ok[None, :]
        row = ba_ptr + tok[:, None] * s_ba
        b = tl.load(row + col_b[None, :], mask=mask, other=0.0).to(tl.float32)
        a = tl.load(row + (col_b + SHARE)[None, :], mask=mask, other=0.0).to(tl.float32)
        rate = tl.exp(tl.load(a_log_ptr + head, mask=head_ok, other=0.0).to(tl.float32))
        x = a + tl.load(dt_bias_ptr + head, mask=head_ok, other=0.0).to(tl.float32)[None, :]
        softplus = tl.where(x > LINEAR_ABOVE, x, tl.log(1.0 + tl.exp(tl.minimum(x, LINEAR_ABOVE))))
        out = tok[:, None] * HV + head[None, :]
        tl.store(g_ptr + out, -rate[None, :] * softplus, mask=mask)
        tl.store(beta_ptr + out, tl.sigmoid(b).to(beta_ptr.dtype.element_ty), mask=mask)
