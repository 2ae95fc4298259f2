"""The production-speed path of ``Attention`` on CUDA: Triton KV store, Triton split-K decode,
prefill by SDPA per sequence or (a step with a long chunk continuing its cached context,
``PREFILL_CONFIG.two_pass``) in two cuDNN passes (:mod:`.two_pass_prefill`). Same semantics as
``Attention.forward_native`` (:mod:`.native`); see
kernels_reference/L1/attention.py for the contract.

Planning reads only the metadata's host tuples and shapes (never ``.tolist()`` of a device tensor),
so a decode step has no host sync and can be captured in a CUDA graph.
"""
from __future__ import annotations

import warnings
from typing import Optional, Set, Tuple

import torch

from ...forward_context import AttentionMetadata
from ..kv_store.store import store_kv_cache_triton
from ..paged_decode import paged_decode
from .native import sequence_kv, split_heads
from . import sdpa_prefill
from .sdpa_prefill import sdpa_causal
from .two_pass_prefill import CUDNN_PARTIALS, prefill_two_pass

# (dtype, query heads, kv heads, head size) whose two-pass prefill raised: the SDPA loop serves them.
_TWO_PASS_REFUSED: Set[tuple] = set()
# Where the two-pass prefill runs, and on which kernels (tests run it on the CPU with MATH_PARTIALS).
TWO_PASS_DEVICES = ("cuda",)
TWO_PASS_PARTIALS = CUDNN_PARTIALS


def paged_attention_fast(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         kv_cache: Optional[Tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata,
                         num_heads: int, num_kv_heads: int, head_size: int, scale: float) -> torch.Tensor:
    t = query.shape[0]
    q, k, v = split_heads(query, key, value, num_heads, num_kv_heads, head_size)
    query_lens, seq_lens = meta.query_lens_cpu, meta.seq_lens_cpu
    if len(query_lens) != meta.num_seqs or sum(query_lens) != t:
        raise ValueError(f"metadata host lengths {query_lens} do not describe {meta.num_seqs} sequences "
                         f"of {t} query tokens")
    if kv_cache is not None:
        key_cache, value_cache = kv_cache
        store_kv_cache_triton(k, v, key_cache, value_cache, meta.slot_mapping)
        if t == meta.num_seqs and all(n == 1 for n in query_lens):
            # Pure decode (the CUDA-graph case): one launch, shapes only.
            out = torch.empty_like(q)
            paged_decode(q, key_cache, value_cache, meta.block_tables, meta.seq_lens, scale, out=out)
            return out.view(t, num_heads * head_size)
        # Decode rows of a mixed batch go through the decode kernel (not with empty sequences,
        # whose "last row" would belong to their neighbour).
        batched_decode = min(query_lens) >= 1 and 1 in query_lens
    else:
        batched_decode = False
    two_pass = _two_pass(q, k, v, kv_cache, meta, scale, skip_single_rows=batched_decode)
    if two_pass is not None:
        if batched_decode:
            _decode_rows_of_mixed_batch(q, two_pass, key_cache, value_cache, meta, scale)
        return two_pass.view(t, num_heads * head_size)
    out = torch.empty_like(q)
    if batched_decode:
        _decode_rows_of_mixed_batch(q, out, key_cache, value_cache, meta, scale)
    starts = [0]
    for q_len in query_lens:
        starts.append(starts[-1] + q_len)
    i = 0
    while i < len(query_lens):
        q_len, n = query_lens[i], seq_lens[i]
        context, a = n - q_len, starts[i]
        if q_len == 0 or (q_len == 1 and batched_decode):
            i += 1
        elif context == 0 and q_len > 1:
            # Adjacent fresh prompts of one length (a batch of new requests) attend in one launch;
            # the step's own rows are their whole history: no gather.
            run = _equal_fresh_prompts(query_lens, seq_lens, i)
            b = starts[i + run]
            out[a:b] = sdpa_causal(q[a:b], k[a:b], v[a:b], 0, scale, sequences=run)
            i += run
        else:
            b = starts[i + 1]
            ks, vs = sequence_kv(kv_cache if context > 0 else None, meta.block_tables[i], n, context, k[a:b], v[a:b])
            out[a:b] = sdpa_causal(q[a:b], ks, vs, context, scale)
            i += 1
    return out.view(t, num_heads * head_size)


def _two_pass(q, k, v, kv_cache, meta: AttentionMetadata, scale: float, skip_single_rows: bool) -> Optional[torch.Tensor]:
    """Every row by :func:`.two_pass_prefill.prefill_two_pass` on cuDNN, or None where that path
    does not apply (not CUDA, not 16-bit, no sequence or an empty one, switched off in
    ``PREFILL_CONFIG`` or no chunk long enough, :func:`two_pass_applies`) or cuDNN refused these
    heads before (warned about once, remembered)."""
    key = (q.dtype, q.shape[1], k.shape[1], q.shape[2])
    if (not two_pass_applies(meta.query_lens_cpu, meta.seq_lens_cpu) or q.device.type not in TWO_PASS_DEVICES
            or q.dtype not in (torch.float16, torch.bfloat16) or min(meta.query_lens_cpu, default=0) < 1
            or key in _TWO_PASS_REFUSED):
        return None
    try:
        return prefill_two_pass(q, k, v, kv_cache, meta, scale, TWO_PASS_PARTIALS, skip_single_rows=skip_single_rows)
    except RuntimeError as exc:
        if q.is_cuda and torch.cuda.is_current_stream_capturing():
            raise  # the capture is broken already; the first call of a shape is made outside capture
        _TWO_PASS_REFUSED.add(key)
        warnings.warn(f"cuDNN two-pass prefill refused {key}: {str(exc)[:200]}; using SDPA per sequence")
        return None


def two_pass_applies(query_lens, seq_lens) -> bool:
    """Whether ``PREFILL_CONFIG`` sends a step with these host lengths to the two passes: switched
    on, and some sequence continues its cached context by ``two_pass_min_chunk`` query tokens or
    more (sdpa_prefill.py has the measurement behind it)."""
    config = sdpa_prefill.PREFILL_CONFIG
    return config.two_pass and any(q >= config.two_pass_min_chunk and n > q for q, n in zip(query_lens, seq_lens))


def _equal_fresh_prompts(query_lens, seq_lens, first: int) -> int:
    """How many sequences from ``first`` on are fresh prompts (no context) of ``first``'s length."""
    length, run = query_lens[first], 1
    while first + run < len(query_lens) and query_lens[first + run] == length and seq_lens[first + run] == length:
        run += 1
    return run


def _decode_rows_of_mixed_batch(q, out, key_cache, value_cache, meta: AttentionMetadata, scale: float) -> None:
    """Decode sequences of a mixed batch through the decode kernel, without a host sync.

    Every sequence's *last* query token attends to its whole history, which is exactly a decode
    step; running the kernel on all last rows with the lengths of multi-token sequences zeroed
    (they do no work) computes the decode rows. The last rows of multi-token sequences keep what
    ``out`` holds, so the prefill pass may run before or after this one.
    """
    starts = meta.query_start_loc
    last_rows = (starts[1:] - 1).long().clamp_(min=0)
    one_token = (starts[1:] - starts[:-1]) == 1
    lens = torch.where(one_token, meta.seq_lens, torch.zeros_like(meta.seq_lens))
    decoded = paged_decode(q.index_select(0, last_rows), key_cache, value_cache, meta.block_tables, lens, scale)
    kept = torch.where(one_token[:, None, None], decoded, out.index_select(0, last_rows))
    out.index_copy_(0, last_rows, kept)
