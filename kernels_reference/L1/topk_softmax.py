"""TopKSoftmax: the router's gating step of a mixture-of-experts layer (vLLM's ``topk_softmax``
kernel behind ``fused_topk``).

``TopKSoftmax(top_k, renormalize)``; ``forward(gating_output[T, E]) -> (topk_weights[T, k] float32,
topk_ids[T, k] int32)``. Softmax over all E router logits in float32, then the k largest
probabilities in descending order; with ``renormalize`` (Mixtral, Qwen3-MoE) the k weights are
divided by their sum, without it (DeepSeek-V2) they stay softmax probabilities. Ties between equal
logits may be broken either way: the task draws logits whose k-th and (k+1)-th values are apart by
a clear margin, so the order, and the ids, are then unique and compared exactly.

The fast path (``forward_triton``) is one Triton program per few token rows: the whole row of E
logits (E <= a few hundred in every real router) sits in registers, the softmax is computed in
float32 and the k largest are taken by k rounds of "arg-max, then knock it out".
"""
from typing import Tuple

import torch
from torch import nn

from ..dispatch import on_meta, use_fast_path
from ..records import RecordsInit

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None


class TopKSoftmax(RecordsInit, nn.Module):
    def __init__(self, top_k: int, renormalize: bool = True):
        super().__init__()
        self.top_k, self.renormalize = top_k, renormalize

    def forward(self, gating_output: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        if on_meta(gating_output):  # shape only: the fast path's float32 weights and int32 ids
            shape = (*gating_output.shape[:-1], self.top_k)
            return (torch.empty(shape, dtype=torch.float32, device=gating_output.device),
                    torch.empty(shape, dtype=torch.int32, device=gating_output.device))
        if triton is not None and use_fast_path(gating_output):
            return self.forward_triton(gating_output)
        return self.forward_native(gating_output)

    def forward_native(self, gating_output: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        compute = torch.float64 if gating_output.dtype == torch.float64 else torch.float32
        probs = torch.softmax(gating_output.to(compute), dim=-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, ids.to(torch.int32)

    def forward_triton(self, gating_output: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        if gating_output.dim() != 2:
            raise ValueError(f"TopKSoftmax expects [tokens, experts] logits, got {tuple(gating_output.shape)}")
        t, e = gating_output.shape
        if not 0 < self.top_k <= e:
            raise ValueError(f"top_k={self.top_k} needs 1..{e} experts")
        x = gating_output if gating_output.stride(-1) == 1 else gating_output.contiguous()
        weights = torch.empty((t, self.top_k), dtype=torch.float32, device=x.device)
        ids = torch.empty((t, self.top_k), dtype=torch.int32, device=x.device)
        if t == 0:
            return weights, ids
        block_e = triton.next_power_of_2(e)
        # A decode step has a handful of rows: one row per program spreads them over the SMs. Many
        # rows: enough per program that each moves a few KB (the kernel is a pure memory stream).
        # The interpreter pays per program, so it takes big tiles.
        if x.is_cuda and not _interpreting():
            rows = 1 if t <= 256 else max(1, min(16, 2048 // block_e))
        else:
            rows = max(1, min(64, 4096 // block_e))
        _topk_softmax_kernel[(triton.cdiv(t, rows),)](
            x, weights, ids, t, e, x.stride(0),
            K=self.top_k, K_PAD=triton.next_power_of_2(self.top_k), BLOCK_E=block_e, ROWS=rows,
            RENORMALIZE=self.renormalize, num_warps=1 if block_e * rows <= 512 else 4)
        return weights, ids


def _interpreting() -> bool:
    from ..triton_rows import interpreting
    return interpreting()


if triton is not None:

    @triton.jit
    def _topk_softmax_kernel(x_ptr, w_ptr, id_ptr, n_rows, n_experts, x_row_stride,
                             K: tl.constexpr, K_PAD: tl.constexpr, BLOCK_E: tl.constexpr,
                             ROWS: tl.constexpr, RENORMALIZE: tl.constexpr):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK_E)
        row_ok = rows < n_rows
        mask = row_ok[:, None] & (cols < n_experts)[None, :]
        logits = tl.load(x_ptr + rows.to(tl.int64)[:, None] * x_row_stride + cols[None, :],
                         mask=mask, other=float("-inf")).to(tl.float32)
        # Padded columns are -inf: exp gives 0, so they neither count in the sum nor get picked
        # (picked probabilities are knocked out to -1, below every real probability).
        top = tl.where(row_ok, tl.max(logits, axis=1), 0.0)  # rows past the end: no -inf - -inf
        e = tl.exp(logits - top[:, None])
        probs = e / tl.where(row_ok, tl.sum(e, axis=1), 1.0)[:, None]
        probs = tl.where(mask, probs, -1.0)
        slots = tl.arange(0, K_PAD)
        picked_w = tl.zeros((ROWS, K_PAD), dtype=tl.float32)
        picked_i = tl.zeros((ROWS, K_PAD), dtype=tl.int32)
        for j in tl.static_range(K):
            best = tl.max(probs, axis=1)
            # the lowest column holding the maximum (a deterministic tie-break; tl.argmax's
            # tie handling differs between Triton versions)
            best_col = tl.min(tl.where(probs == best[:, None], cols[None, :], BLOCK_E), axis=1)
            picked_w = tl.where(slots[None, :] == j, best[:, None], picked_w)
            picked_i = tl.where(slots[None, :] == j, best_col[:, None], picked_i)
            probs = tl.where(cols[None, :] == best_col[:, None], -1.0, probs)
        if RENORMALIZE:
            total = tl.sum(tl.where(slots[None, :] < K, picked_w, 0.0), axis=1)
            picked_w = picked_w / tl.where(row_ok, total, 1.0)[:, None]
        out_mask = row_ok[:, None] & (slots < K)[None, :]
        out_off = rows.to(tl.int64)[:, None] * K + slots[None, :]
        tl.store(w_ptr + out_off, picked_w, mask=out_mask)
        tl.store(id_ptr + out_off, picked_i, mask=out_mask)
