"""Attention over a paged KV cache, as vLLM's ``Attention`` layer calls FlashAttention.

``Attention(num_heads, head_size, scale, num_kv_heads)``; ``forward(query[T, nq*d], key[T, nk*d],
value[T, nk*d]) -> [T, nq*d]``. Metadata comes from the forward context
(:mod:`kernels_reference.forward_context`): the step's new keys/values are stored into the layer's
cache at ``slot_mapping`` (``store_kv_cache``, vLLM's reshape_and_cache), then every sequence's
query tokens attend causally to its whole cached history through its block table. One code path
covers packed varlen prefill, chunked prefill that reads earlier chunks from the cache, and decode.

``kv_cache`` is ``(key_cache, value_cache)``, each [num_blocks, block_size, num_kv_heads, head_size],
bound by the model runner. Without a cache (or metadata) the layer attends causally within each
packed sequence (cu_seqlens) or, with no metadata at all, within the whole batch as one sequence.
The native forms (store, gather, causal attention) are in :mod:`kernels_reference.ops.attention.native`.

``forward`` picks the path as production does: on CUDA the fast path (:mod:`kernels_reference.ops.attention.fast`:
Triton KV store, Triton split-K paged decode, SDPA prefill per sequence, or two cuDNN passes merged
by log-sum-exp for a step with a long chunk continuing its cached context), elsewhere
``forward_native``; under
``torch.compile`` the layer's work is one opaque custom op, ``fk::paged_attention`` (vLLM wraps its
attention the same way), whose implementation makes that choice when it runs.
"""
from typing import Optional, Tuple

import torch
from torch import nn

from ..dispatch import op_name, use_fast_path
from ..forward_context import AttentionMetadata, get_forward_context
from ..ops.attention.native import (causal_attention, gather_kv, paged_attention_native,  # noqa: F401
                                    sequence_kv, split_heads, store_kv_cache)
from ..records import RecordsInit

try:
    import triton
except ImportError:  # the native path still works without Triton
    triton = None


_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # float64 (the truth) stays native


def _paged_attention_for_device(query, key, value, kv_cache, meta, num_heads, num_kv_heads, head_size, scale):
    """The fast path on CUDA (with Triton), the native one elsewhere."""
    args = (query, key, value, kv_cache, meta, num_heads, num_kv_heads, head_size, scale)
    if triton is not None and query.dtype in _KERNEL_DTYPES and use_fast_path(query, key, value):
        from ..ops.attention.fast import paged_attention_fast  # imports the Triton kernels

        return paged_attention_fast(*args)
    return paged_attention_native(*args)


class Attention(RecordsInit, nn.Module):
    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: Optional[int] = None):
        super().__init__()
        self.num_heads, self.head_size, self.scale = num_heads, head_size, scale
        self.num_kv_heads = num_kv_heads or num_heads
        self.kv_cache: Optional[Tuple[torch.Tensor, torch.Tensor]] = None

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        meta = get_forward_context()
        if meta is None:  # no metadata: the whole batch is one causal sequence
            if use_fast_path(query, key, value):
                from ..ops.attention.sdpa_prefill import sdpa_causal

                q, k, v = split_heads(query, key, value, self.num_heads, self.num_kv_heads, self.head_size)
                return sdpa_causal(q, k, v, 0, self.scale).reshape(query.shape[0], -1)
            return self.forward_native(query, key, value)
        if torch.compiler.is_compiling():
            # One opaque op: the metadata's per-step host values never become Dynamo guards, so one
            # graph serves every step; the op's implementation picks the path when it runs.
            cache = self.kv_cache or (None, None)
            return paged_attention(
                query, key, value, cache[0], cache[1], meta.query_start_loc, meta.seq_lens,
                meta.block_tables, meta.slot_mapping, self.num_heads, self.num_kv_heads, self.head_size,
                self.scale)
        return _paged_attention_for_device(query, key, value, self.kv_cache, meta, self.num_heads,
                                           self.num_kv_heads, self.head_size, self.scale)

    def forward_fast(self, query, key, value):
        """The CUDA path (Triton store and decode, SDPA prefill); runs on CPU tensors only under
        ``TRITON_INTERPRET=1``. Needs a forward context."""
        from ..ops.attention.fast import paged_attention_fast

        return paged_attention_fast(query, key, value, self.kv_cache, get_forward_context(), self.num_heads,
                                    self.num_kv_heads, self.head_size, self.scale)

    def forward_native(self, query, key, value):
        meta = get_forward_context()
        if meta is None:
            q, k, v = split_heads(query, key, value, self.num_heads, self.num_kv_heads, self.head_size)
            return causal_attention(q, k, v, 0, self.scale).reshape(query.shape[0], -1)
        return paged_attention_native(query, key, value, self.kv_cache, meta, self.num_heads, self.num_kv_heads,
                                      self.head_size, self.scale)


# ---- torch.compile: the layer's work as one custom op --------------------------------------------

def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same memory seen the same way (a compiled graph may hand the op an alias, not the object)."""
    return a is b or (a.device == b.device and a.data_ptr() == b.data_ptr() and a.shape == b.shape
                      and a.stride() == b.stride())


def _step_metadata(query_start_loc, seq_lens, block_tables, slot_mapping, block_size) -> AttentionMetadata:
    """The step's metadata with its host lengths.

    Host values (lengths per sequence, max query length) cannot be op arguments without becoming
    Dynamo guards (a recompile per step), so the op takes the metadata's tensors and finds their
    host copies in the forward context that holds those very tensors, as vLLM's attention op reads
    its forward context. Called outside such a context, it derives them from the device (a sync).
    """
    meta = get_forward_context()
    if (meta is not None and _same_tensor(meta.seq_lens, seq_lens)
            and _same_tensor(meta.query_start_loc, query_start_loc)):
        return meta
    starts = query_start_loc.tolist()
    query_lens = [b - a for a, b in zip(starts, starts[1:])]
    lens = seq_lens.tolist()
    return AttentionMetadata(query_start_loc, seq_lens, block_tables, slot_mapping, block_size,
                             max(query_lens, default=0), max(lens, default=0), tuple(query_lens), tuple(lens))


# A copy of this file imported under another name (a candidate tree that copies the reference, or
# ``--fk-candidate=kernels_reference``) registers its own op instead of colliding with this one.
_OP_NAME = op_name("paged_attention", __name__)  # a copy of this file registers its own op


@torch.library.custom_op(_OP_NAME, mutates_args=("key_cache", "value_cache"))
def paged_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    key_cache: Optional[torch.Tensor], value_cache: Optional[torch.Tensor],
                    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                    slot_mapping: torch.Tensor, num_heads: int, num_kv_heads: int, head_size: int,
                    scale: float) -> torch.Tensor:
    """``Attention.forward`` of one layer and step as an op: store K/V into the caches, attend."""
    kv_cache = None if key_cache is None else (key_cache, value_cache)
    block_size = key_cache.shape[1] if key_cache is not None else 1
    meta = _step_metadata(query_start_loc, seq_lens, block_tables, slot_mapping, block_size)
    return _paged_attention_for_device(query, key, value, kv_cache, meta, num_heads, num_kv_heads, head_size, scale)


@paged_attention.register_fake
def _paged_attention_fake(query, key, value, key_cache, value_cache, query_start_loc, seq_lens, block_tables,
                          slot_mapping, num_heads, num_kv_heads, head_size, scale):
    return query.new_empty(query.shape[0], num_heads * head_size)
