"""A torch stand-in for FlashAttention 4's ``flash_attn.cute.flash_attn_varlen_func`` on a paged
cache, as its docstring states it (``page_table`` [batch, pages] int32 over K/V [pages, page_size,
kv_heads, d], ``seqused_k`` keys per sequence, ``cu_seqlens_q`` the packed queries, causal aligned
with the end of each sequence's keys), so CPU tests can check the peer's plumbing, not FlashAttention.
``IGNORE_SEQUSED`` makes it read every page of the table (a plumbing bug the check must see)."""
import torch

from .flashinfer import _attend

IGNORE_SEQUSED = False


def flash_attn_varlen_func(q, k, v, cu_seqlens_q=None, seqused_k=None, max_seqlen_q=None, max_seqlen_k=None,
                           page_table=None, softmax_scale=None, causal=False, **kw):
    if page_table is None or page_table.dtype != torch.int32:
        raise ValueError("the stand-in takes a paged cache with an int32 page_table only")
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    page = k.shape[1]
    out = torch.empty_like(q)
    for b in range(len(cu_seqlens_q) - 1):
        n = page_table.shape[1] * page if IGNORE_SEQUSED else int(seqused_k[b])
        pages = page_table[b, :-(-n // page)].long()
        keys, values = (c[pages].reshape(-1, *c.shape[2:])[:n].double() for c in (k, v))
        a, e = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        out[a:e] = _attend(q[a:e], keys, values, scale, causal).to(q.dtype)
    return out, None
