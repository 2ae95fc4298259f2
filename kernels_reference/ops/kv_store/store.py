"""Store a step's keys and values into the paged KV cache (vLLM's ``reshape_and_cache``), in Triton.

Token ``t`` goes to slot ``slot_mapping[t]`` = block * block_size + offset. A negative slot means
"no slot" (the padded tokens of a CUDA-graph batch) and is skipped, so a captured graph stays valid
whatever the padding. The op is a pure copy: one program moves one token's K and V rows, all heads
at once, so it is bound only by memory bandwidth.
"""
from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the native path still works without Triton
    triton = None


def store_kv_cache_triton(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                          value_cache: torch.Tensor, slot_mapping: torch.Tensor, num_warps: int = 4) -> None:
    """key/value [T, nk, d] or [T, nk * d] (strided rows fine); caches [num_blocks, block_size, nk, d]."""
    if triton is None:
        raise RuntimeError("store_kv_cache_triton needs Triton")
    if key_cache.dim() != 4 or key_cache.shape != value_cache.shape:
        raise ValueError(f"caches must both be [num_blocks, block_size, nk, d], got "
                         f"{tuple(key_cache.shape)} and {tuple(value_cache.shape)}")
    _, block_size, num_kv_heads, head_dim = key_cache.shape
    tokens = slot_mapping.shape[0]
    key = key.reshape(key.shape[0], num_kv_heads, head_dim)  # a view for qkv column slices
    value = value.reshape(value.shape[0], num_kv_heads, head_dim)
    if key.shape[0] != tokens or value.shape[0] != tokens:
        raise ValueError(f"{tokens} slots for {key.shape[0]} keys and {value.shape[0]} values")
    if tokens == 0:
        return
    if key.stride(-1) != 1:
        key = key.contiguous()
    if value.stride(-1) != 1:
        value = value.contiguous()
    if key_cache.stride(-1) != 1 or value_cache.stride(-1) != 1:
        raise ValueError("the KV cache must have a unit stride over the head dimension")
    _store_kv_kernel[(tokens,)](
        key, value, key_cache, value_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        block_size,
        NUM_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        HEADS_PAD=triton.next_power_of_2(num_kv_heads), DIM_PAD=triton.next_power_of_2(head_dim),
        num_warps=num_warps,
    )


if triton is not None:

    @triton.jit
    def _store_kv_kernel(
        key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
        k_s_tok, k_s_head, v_s_tok, v_s_head,
        kc_s_block, kc_s_tok, kc_s_head, vc_s_block, vc_s_tok, vc_s_head,
        block_size,
        NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, HEADS_PAD: tl.constexpr, DIM_PAD: tl.constexpr,
    ):
        token = tl.program_id(0).to(tl.int64)
        slot = tl.load(slot_ptr + token).to(tl.int64)
        block = slot // block_size
        offset = slot % block_size
        h = tl.arange(0, HEADS_PAD)[:, None]
        d = tl.arange(0, DIM_PAD)[None, :]
        # (the slot test broadcast to a tile: Triton's interpreter rejects a scalar inside a mask)
        mask = (h < NUM_HEADS) & (d < HEAD_DIM) & (h * 0 + slot >= 0)
        k = tl.load(key_ptr + token * k_s_tok + h * k_s_head + d, mask=mask)
        tl.store(k_cache_ptr + block * kc_s_block + offset * kc_s_tok + h * kc_s_head + d,
                 k.to(k_cache_ptr.dtype.element_ty), mask=mask)
        v = tl.load(value_ptr + token * v_s_tok + h * v_s_head + d, mask=mask)
        tl.store(v_cache_ptr + block * vc_s_block + offset * vc_s_tok + h * vc_s_head + d,
                 v.to(v_cache_ptr.dtype.element_ty), mask=mask)
