"""Causal attention of one sequence's query tokens through ``F.scaled_dot_product_attention``.

Prefill is compute-bound, and torch ships production flash kernels for it (cuDNN, FlashAttention-2,
memory-efficient), so the reference uses the library rather than a hand-written kernel:

* no cached context (query and keys cover the same positions): ``is_causal=True``;
* cached context (a later chunk of a prompt, or a decode token): the query sits at the *end* of
  the keys, so the mask is bottom-right aligned, ``torch.nn.attention.bias.causal_lower_right``.
  torch routes that bias to FlashAttention (whose causal mode is bottom-right) or the
  memory-efficient kernel, else materialises it; cuDNN is never used for it.

GQA: ``enable_gqa=True`` lets the backends that support it (FlashAttention; memory-efficient on
recent torch; math) read the shared K/V heads directly. ``PrefillConfig.expand_kv`` instead
repeats K/V to one head per query head, which every backend accepts (cuDNN included) at the cost
of the copy; benchmarks/attention.py measures both so the default can follow the numbers.
"""
from __future__ import annotations

import contextlib
import dataclasses

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

_BACKENDS = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}


@dataclasses.dataclass(frozen=True)
class PrefillConfig:
    backend: str = "auto"  # "auto": torch's own choice; else the preferred backend, the rest as fallbacks
    expand_kv: bool = False  # repeat K/V heads instead of enable_gqa
    # On CUDA in 16 bits: a step's prefill in cuDNN's two passes (own keys, then cached context,
    # merged by log-sum-exp) instead of a call per sequence (two_pass_prefill.py says why), for a
    # step in which one sequence continues its cached context by at least ``two_pass_min_chunk``
    # query tokens: there the call per sequence takes torch's bottom-right causal kernel
    # (FlashAttention-2). On an H100 on 2026-12-07 (docs/perf/h100-2026-12-07i.md, `mixed-prefill`
    # step) the two passes took the attention task's B118 batches (a 4352-token chunk over 2176
    # cached) 1.37-1.41x faster than the call per sequence, with 1.03-1.04x its error against
    # float64; on B33 (its one continuing chunk: 92 tokens) 0.96x and on fresh prompts 0.98x.
    two_pass: bool = True
    two_pass_min_chunk: int = 1024

    def __post_init__(self):
        if self.backend != "auto" and self.backend not in _BACKENDS:
            raise ValueError(f"unknown SDPA backend {self.backend!r}; choose auto or one of {sorted(_BACKENDS)}")


PREFILL_CONFIG = PrefillConfig()


def backend_scope(backend: str):
    """SDPA calls inside use ``backend`` ("cudnn", "flash", "efficient", "math") where it applies;
    "auto" leaves torch's own choice."""
    if backend == "auto":
        return contextlib.nullcontext()
    preferred = _BACKENDS[backend]
    # Priority order: the preferred backend first, the others as fallbacks (e.g. float32 inputs,
    # which FlashAttention and cuDNN do not take).
    order = [preferred] + [b for b in _BACKENDS.values() if b != preferred]
    return sdpa_kernel(order, set_priority=True)



def sdpa_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context: int, scale: float,
                config: PrefillConfig = PREFILL_CONFIG, sequences: int = 1) -> torch.Tensor:
    """q [L, nq, d] at positions context..context+L-1 over k/v [context + L, nk, d]; returns [L, nq, d].

    ``sequences`` > 1: q, k and v hold that many fresh prompts of equal length back to back (no
    context), attended as one batch: a single launch instead of one per prompt, which fills the GPU
    where one short prompt's (heads x query tiles) do not."""
    length, num_heads, _ = q.shape
    if k.shape[0] != context + length:
        raise ValueError(f"{k.shape[0]} keys for {length} queries after {context} cached tokens")
    if sequences > 1 and (context != 0 or length % sequences):
        raise ValueError(f"{sequences} batched prompts need no context and {length} rows divisible among them")
    group = num_heads // k.shape[1]
    if config.expand_kv and group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    # [sequences, heads, tokens, d] views of the packed [tokens, heads, d] rows: no copy.
    qh, kh, vh = (x.view(sequences, x.shape[0] // sequences, *x.shape[1:]).transpose(1, 2) for x in (q, k, v))
    gqa = k.shape[1] != num_heads
    with backend_scope(config.backend):
        if context == 0:
            out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale, enable_gqa=gqa)
        else:
            mask = causal_lower_right(length, k.shape[0])
            out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale, enable_gqa=gqa)
    return out.transpose(1, 2).reshape(length, num_heads, -1)
