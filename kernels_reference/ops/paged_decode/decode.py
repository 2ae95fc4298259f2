"""``paged_decode``: the entry point. Checks the config and inputs, then launches the kernel that
``DecodeConfig.kernel`` names (two-pass, one-pass or blocks). ``DECODE_CONFIG`` here is the default a
call without ``config`` runs (benchmarks and tests replace it on this module).
"""
from __future__ import annotations

from typing import Optional

import torch

from .blocks import launch_blocks
from .config import DECODE_CONFIG, KERNELS, PDL_MODES, DecodeConfig, small_batch_pdl  # noqa: F401
from .device import VariantUnavailable, _cuda_launch_option, pdl_unavailable_reason, sm_count, triton
from .one_pass import _launch_one_pass
from .two_pass import _launch_two_pass


def _check_inputs(query, key_cache, value_cache, block_tables, seq_lens):
    if query.dim() != 3 or key_cache.dim() != 4 or key_cache.shape != value_cache.shape:
        raise ValueError(f"expected query [B, nq, d] and caches [blocks, block_size, nk, d], got "
                         f"{tuple(query.shape)}, {tuple(key_cache.shape)}, {tuple(value_cache.shape)}")
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, cache_dim = key_cache.shape
    if cache_dim != head_dim or num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads of size {head_dim} do not fit a cache of "
                         f"{num_kv_heads} kv heads of size {cache_dim}")
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs or seq_lens.shape != (num_seqs,):
        raise ValueError(f"block_tables {tuple(block_tables.shape)} / seq_lens {tuple(seq_lens.shape)} "
                         f"do not describe {num_seqs} sequences")
    if key_cache.stride(-1) != 1 or value_cache.stride(-1) != 1:
        raise ValueError("the KV cache must have a unit stride over the head dimension")


def paged_decode(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                 block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                 out: Optional[torch.Tensor] = None, config: Optional[DecodeConfig] = None,
                 num_splits: Optional[int] = None) -> torch.Tensor:
    """Attention of one query token per sequence over its paged history.

    query [B, nq, d] (any strides with a unit last stride: a view of the fused qkv is fine);
    key_cache / value_cache [num_blocks, block_size, nk, d]; block_tables [B, max_blocks] int32;
    seq_lens [B] int32 (tokens in the cache, including this step's). Returns ``out`` [B, nq, d]
    (allocated in the query's dtype when not given). ``num_splits`` overrides the shape-derived
    choice (tests use it to force uneven partitions). ``config.kernel`` picks the kernel.
    """
    if triton is None:
        raise RuntimeError("paged_decode needs Triton")
    config = config or DECODE_CONFIG
    if config.kernel not in KERNELS:
        raise ValueError(f"unknown decode kernel {config.kernel!r}; expected one of {KERNELS}")
    if config.pdl not in PDL_MODES:
        raise ValueError(f"unknown pdl mode {config.pdl!r}; expected one of {PDL_MODES}")
    if config.kernel == "one-pass" and (config.pdl != "off" or config.interleaved):
        raise ValueError("pdl and interleaved are options of the two-pass kernel")
    if config.kernel == "blocks" and (config.interleaved or config.fused_merge or config.max_registers is not None):
        raise ValueError("interleaved, fused_merge and max_registers are options of the two-pass kernel, "
                         "not of kernel 'blocks'")
    if config.kv_loads not in ("pointers", "tma"):
        raise ValueError(f"unknown kv_loads {config.kv_loads!r}; expected 'pointers' or 'tma'")
    if config.kv_loads == "tma" and config.kernel != "blocks":
        raise ValueError("kv_loads='tma' is an option of kernel 'blocks'")
    if config.pdl == "small-batch":
        usable = query.is_cuda and not torch.compiler.is_compiling() and pdl_unavailable_reason(query.device) is None
        config = small_batch_pdl(config, query.shape[0] * key_cache.shape[2], sm_count(query.device), usable)
    if config.pdl != "off" and query.is_cuda:
        reason = pdl_unavailable_reason(query.device)
        if reason:
            raise VariantUnavailable(f"DecodeConfig(pdl={config.pdl!r}): {reason}")
    mpph = config.merge_programs_per_head
    if mpph < 1 or mpph & (mpph - 1):
        raise ValueError(f"merge_programs_per_head must be a power of two, got {mpph}")
    if config.max_registers is not None:
        if config.kernel != "two-pass":
            raise ValueError("max_registers is an option of the two-pass kernel")
        if query.is_cuda and not _cuda_launch_option("maxnreg"):
            raise VariantUnavailable(f"DecodeConfig(max_registers=...): triton {triton.__version__} has no maxnreg")
    _check_inputs(query, key_cache, value_cache, block_tables, seq_lens)
    if query.stride(-1) != 1:
        query = query.contiguous()
    if block_tables.stride(-1) != 1:
        block_tables = block_tables.contiguous()
    if out is None:
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    if query.shape[0] == 0:
        return out
    tile = config.blocks_per_iter * key_cache.shape[1]
    if tile < 16 or tile & (tile - 1):
        raise ValueError(f"blocks_per_iter * block_size must be a power of two >= 16, got {tile}")
    wide = config.unsplit_tile_tokens
    if wide is not None and (wide < 16 or wide & (wide - 1)):
        raise ValueError(f"unsplit_tile_tokens must be a power of two >= 16 (or None), got {wide}")
    if config.kernel == "blocks":
        launch = launch_blocks
    else:
        launch = _launch_one_pass if config.kernel == "one-pass" else _launch_two_pass
    launch(query, key_cache, value_cache, block_tables, seq_lens, scale, out, config, num_splits)
    return out
