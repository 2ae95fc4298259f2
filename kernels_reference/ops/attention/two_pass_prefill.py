"""A step's prefill rows in two passes over fused library kernels, merged by log-sum-exp.

1. Every sequence's queries over the step's own keys: causal (queries and keys are the same
   tokens, so top-left and bottom-right causal agree), a launch per run of equal-length sequences.
2. Each chunk that continues a cached sequence: its queries over the cached context, with no mask
   (every context key precedes every query), one launch per such chunk; the two partial results
   are merged by their log-sum-exps (:mod:`.merge_partials`).

Why not one SDPA call per sequence (:mod:`.fast`'s loop): a continuing chunk needs the bottom-right
causal mask over context + own keys, which torch routes to FlashAttention-2 (295 TFLOP/s on the
H200, docs/perf/h200-attention.md, where cuDNN's causal kernel reached 612), and fresh prompts of
different lengths each took their own launch (they still do). On an H100 on 2026-12-07
FlashAttention 4's single varlen launch was 1.4-1.8x faster than that loop on every mixed batch of the attention task
(docs/perf/h100-2026-12-07g.md). Both passes here are shapes cuDNN's fused kernels take.

``PartialAttention`` is the kernel pair the plan calls: ``CUDNN_PARTIALS`` on CUDA (torch's aten
cuDNN op, which returns the log-sum-exp), ``FLASH_VARLEN_PARTIALS`` (pass 1 in one FlashAttention-2
varlen launch; benchmarks/mixed_prefill.py times both), ``MATH_PARTIALS`` (float32 einsum, any
device) for tests.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch

from ...forward_context import AttentionMetadata
from .merge_partials import merge_partials
from .native import gather_kv

Partial = Tuple[torch.Tensor, torch.Tensor]  # output [L, H, D], float32 log-sum-exp [L, H]


class PartialAttention:
    """Attention that also returns each query row's log-sum-exp (natural log of the sum of
    exp(scaled scores)), so that results over disjoint key sets can be merged."""

    def causal_ragged(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                      lengths: Sequence[int], scale: float, skip: Sequence[bool] = ()) -> Partial:
        """Packed sequences (q/k/v [T, heads, d]; ``cu_seqlens`` [B + 1] int32 on the device,
        ``lengths`` the same on the host), each attending causally to its own tokens. The rows of
        a sequence whose ``skip`` is True may be left undefined (the caller computes them)."""
        raise NotImplementedError

    def full(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> Partial:
        """q [L, heads, d] over k/v [C, kv heads, d], no mask."""
        raise NotImplementedError


class MathPartials(PartialAttention):
    """float32 einsum and softmax, sequence by sequence: the definition, for tests on any device."""

    def causal_ragged(self, q, k, v, cu_seqlens, lengths, scale, skip=()):
        out = torch.zeros_like(q)
        lse = torch.zeros(q.shape[:2], dtype=torch.float32, device=q.device)
        for a, b, run in _equal_length_runs(lengths, skip):
            n = (b - a) // run
            for start in range(a, b, n):
                rows = slice(start, start + n)
                out[rows], lse[rows] = _math_partial(q[rows], k[rows], v[rows], scale, causal=True)
        return out, lse

    def full(self, q, k, v, scale):
        return _math_partial(q, k, v, scale, causal=False)


def _math_partial(q, k, v, scale, causal: bool) -> Partial:
    group = q.shape[1] // k.shape[1]
    qf = q.float()
    kf = k.float().repeat_interleave(group, dim=1)
    vf = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", qf, kf) * scale
    if causal:
        pos = torch.arange(q.shape[0], device=q.device)
        scores = scores.masked_fill(pos[None, :] > pos[:, None], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [H, L]
    out = torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), vf)
    return out.to(q.dtype), lse.t().contiguous()


class CudnnPartials(PartialAttention):
    """torch's dense cuDNN attention op (``_scaled_dot_product_cudnn_attention``) asked for its
    log-sum-exp: pass 1 one launch per run of equal-length sequences (batched), pass 2 one per chunk.

    Dense, not ragged: torch 2.11's ragged cuDNN path (``_cudnn_attention_forward`` with
    cu_seqlens) builds its cuDNN graph on every call and broke CUDA-graph capture on an H100 on
    2026-12-07 (docs/perf/h100-2026-12-07h.md); the dense op caches its graphs per shape.
    Grouped-query heads are passed as they are; if cuDNN refuses them (``gqa_native`` False after
    the first refusal), K/V are repeated to one head per query head."""

    def __init__(self):
        self.gqa_native: Optional[bool] = None

    def causal_ragged(self, q, k, v, cu_seqlens, lengths, scale, skip=()):
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
        for a, b, run in _equal_length_runs(lengths, skip):
            n = (b - a) // run
            # [run, heads, n, d] views of the packed [tokens, heads, d] rows: no copy
            qh, kh, vh = (x[a:b].view(run, n, *x.shape[1:]).transpose(1, 2) for x in (q, k, v))
            o, l = self._dense(qh, kh, vh, scale, causal=True)
            out[a:b] = o.transpose(1, 2).reshape(b - a, *q.shape[1:])
            lse[a:b] = l.reshape(run, q.shape[1], n).transpose(1, 2).reshape(b - a, q.shape[1])
        return out, lse

    def full(self, q, k, v, scale):
        qh, kh, vh = (x.unsqueeze(0).transpose(1, 2) for x in (q, k, v))  # [1, heads, L, d] views
        o, l = self._dense(qh, kh, vh, scale, causal=False)
        return o[0].transpose(0, 1), l.reshape(q.shape[1], q.shape[0]).t()

    def _dense(self, qh, kh, vh, scale, causal: bool) -> Partial:
        group = qh.shape[1] // kh.shape[1]
        if group > 1 and self.gqa_native is None:
            try:
                result = cudnn_attention(qh, kh, vh, scale, causal)
                self.gqa_native = True
                return result
            except RuntimeError:
                self.gqa_native = False
        if group > 1 and not self.gqa_native:
            kh, vh = kh.repeat_interleave(group, dim=1), vh.repeat_interleave(group, dim=1)
        return cudnn_attention(qh, kh, vh, scale, causal)


def cudnn_attention(qh: torch.Tensor, kh: torch.Tensor, vh: torch.Tensor, scale: float, causal: bool) -> Partial:
    """torch's cuDNN attention on [B, heads, L, d] views: output [B, heads, L, d] and the float32
    log-sum-exp [B, heads, L] (or [B, heads, L, 1])."""
    res = torch.ops.aten._scaled_dot_product_cudnn_attention(qh, kh, vh, None, True, 0.0, causal, False, scale=scale)
    return res[0], res[1]


class FlashVarlenPartials(CudnnPartials):
    """Pass 1 as one FlashAttention-2 varlen launch over the whole step (torch's
    ``_flash_attention_forward`` with cu_seqlens; grouped-query heads native), pass 2 on cuDNN."""

    def causal_ragged(self, q, k, v, cu_seqlens, lengths, scale, skip=()):
        longest = max(lengths)  # one launch whatever is skipped
        res = torch.ops.aten._flash_attention_forward(q, k, v, cu_seqlens, cu_seqlens, longest, longest, 0.0, True,
                                                      False, scale=scale)
        return res[0], rows_of_varlen_lse(res[1], cu_seqlens, q.shape[0], q.shape[1], longest)


def rows_of_varlen_lse(lse: torch.Tensor, cu_seqlens: torch.Tensor, tokens: int, heads: int, longest: int) -> torch.Tensor:
    """A varlen kernel's log-sum-exp as [tokens, heads]: FlashAttention-2 returns it unpadded,
    [heads, tokens], or (older builds) padded per sequence, [sequences, heads, longest]; the
    padded form is gathered on the device (no host sync: capturable)."""
    if tuple(lse.shape) == (heads, tokens):
        return lse.t()
    sequences = cu_seqlens.numel() - 1
    if tuple(lse.shape) != (sequences, heads, longest):
        raise RuntimeError(f"varlen log-sum-exp of shape {tuple(lse.shape)}: expected [heads, tokens] = "
                           f"[{heads}, {tokens}] or [sequences, heads, longest] = [{sequences}, {heads}, {longest}]")
    rows = torch.arange(tokens, device=lse.device)
    seq = torch.searchsorted(cu_seqlens[1:].long(), rows, right=True)
    return lse[seq, :, rows - cu_seqlens.long()[seq]]


def _equal_length_runs(lengths: Sequence[int], skip: Sequence[bool] = ()):
    """(first row, end row, sequences) of each run of adjacent sequences of one length, leaving
    out the sequences whose ``skip`` is True."""
    skip = list(skip) + [False] * (len(lengths) - len(skip))
    a, i = 0, 0
    while i < len(lengths):
        j = i
        while j + 1 < len(lengths) and lengths[j + 1] == lengths[i] and skip[j + 1] == skip[i]:
            j += 1
        b = a + lengths[i] * (j - i + 1)
        if not skip[i]:
            yield a, b, j - i + 1
        a, i = b, j + 1


MATH_PARTIALS = MathPartials()
CUDNN_PARTIALS = CudnnPartials()
FLASH_VARLEN_PARTIALS = FlashVarlenPartials()


def prefill_two_pass(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     kv_cache: Optional[Tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata, scale: float,
                     partials: PartialAttention, skip_single_rows: bool = False) -> torch.Tensor:
    """Every row's attention, [T, heads, d], for a step whose sequences all have query tokens.

    ``skip_single_rows``: the rows of one-token sequences are left undefined, because the caller
    computes them elsewhere (the decode kernel)."""
    query_lens, seq_lens = meta.query_lens_cpu, meta.seq_lens_cpu
    if not query_lens or min(query_lens) < 1:
        raise ValueError(f"two-pass prefill needs a query token in every sequence, got lengths {query_lens}")
    skip = [skip_single_rows and n == 1 for n in query_lens]
    out, lse = partials.causal_ragged(q, k, v, meta.query_start_loc, query_lens, scale, skip)
    a = 0
    for i, (q_len, n) in enumerate(zip(query_lens, seq_lens)):
        b, context = a + q_len, n - q_len
        if context > 0 and not (skip_single_rows and q_len == 1):
            if kv_cache is None:
                raise ValueError("a sequence with cached context needs the layer's kv_cache")
            ks = gather_kv(kv_cache[0], meta.block_tables[i], context)
            vs = gather_kv(kv_cache[1], meta.block_tables[i], context)
            ctx_out, ctx_lse = partials.full(q[a:b], ks, vs, scale)
            merge_partials(out[a:b], lse[a:b], ctx_out, ctx_lse, out[a:b])
        a = b
    return out
