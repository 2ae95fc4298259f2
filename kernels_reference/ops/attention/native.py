"""The native (pure PyTorch) forms of paged attention: the semantic definition of ``Attention``
(``forward_native``) and the helpers its fast path shares (head split, a sequence's cached K/V).

Store a step's K/V into the paged cache (vLLM's reshape_and_cache), gather a sequence's history
through its block table, and attend causally; float64 in, float64 out for the suite's truth.
"""
from typing import Optional, Tuple

import torch

from ...dispatch import compute_dtype
from ...forward_context import AttentionMetadata


def store_kv_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                   value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write each token's key/value into its slot (block * block_size + offset), in place.

    A negative slot is "no slot" (a padded token of a CUDA-graph batch): that token is skipped.
    """
    nk, d = key_cache.shape[-2:]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    key_cache.view(-1, nk, d)[slots] = key.reshape(-1, nk, d)[keep].to(key_cache.dtype)
    value_cache.view(-1, nk, d)[slots] = value.reshape(-1, nk, d)[keep].to(value_cache.dtype)


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` positions of one sequence, [length, nk, d], from the paged cache."""
    block_size = cache.shape[1]
    blocks = block_table[: -(-length // block_size)].long()
    return cache[blocks].reshape(-1, *cache.shape[2:])[:length]


def split_heads(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, num_heads: int,
                num_kv_heads: int, head_size: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[T, heads * d] rows (views of the fused qkv columns are fine) as [T, heads, d]."""
    t = query.shape[0]
    return (query.reshape(t, num_heads, head_size), key.reshape(t, num_kv_heads, head_size),
            value.reshape(t, num_kv_heads, head_size))


def sequence_kv(kv_cache: Optional[Tuple[torch.Tensor, torch.Tensor]], block_table: torch.Tensor, length: int,
                context: int, own_k: torch.Tensor, own_v: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """One sequence's keys/values to attend to: its whole history gathered from the paged cache, or,
    with no cache given, the step's own packed rows (which is all of it only without context)."""
    if kv_cache is not None:
        return gather_kv(kv_cache[0], block_table, length), gather_kv(kv_cache[1], block_table, length)
    if context == 0:
        return own_k, own_v
    raise ValueError("a sequence with cached context needs the layer's kv_cache")


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context: int, scale: float) -> torch.Tensor:
    """q [Lq, nq, d] at positions context..context+Lq-1 over k/v [Lk, nk, d] at 0..Lk-1."""
    compute = compute_dtype(q.dtype)
    group = q.shape[1] // k.shape[1]
    qc = q.to(compute)
    kc = k.to(compute).repeat_interleave(group, dim=1)
    vc = v.to(compute).repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", qc, kc) * scale
    q_pos = torch.arange(q.shape[0], device=q.device)[:, None] + context
    k_pos = torch.arange(k.shape[0], device=q.device)[None, :]
    scores = scores.masked_fill(k_pos > q_pos, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, vc).to(q.dtype)


def paged_attention_native(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           kv_cache: Optional[Tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata,
                           num_heads: int, num_kv_heads: int, head_size: int, scale: float) -> torch.Tensor:
    """The semantic definition of one step: store the new K/V, then each sequence's queries attend
    causally to its cached history (float64 in, float64 out: the suite's ground truth)."""
    t = query.shape[0]
    q, k, v = split_heads(query, key, value, num_heads, num_kv_heads, head_size)
    if kv_cache is not None:
        store_kv_cache(k, v, kv_cache[0], kv_cache[1], meta.slot_mapping)
    out = torch.empty_like(q)
    a = 0
    for i, (q_len, n) in enumerate(zip(meta.query_lens_cpu, meta.seq_lens_cpu)):
        b = a + q_len
        context = n - q_len
        ks, vs = sequence_kv(kv_cache, meta.block_tables[i], n, context, k[a:b], v[a:b])
        out[a:b] = causal_attention(q[a:b], ks, vs, context, scale)
        a = b
    return out.reshape(t, -1)
