"""MambaChunkScanCombined: Mamba-2's SSD scan over a packed prefill batch, as vLLM's ``MambaMixer2``
calls ``mamba_chunk_scan_combined_varlen`` (mamba-ssm's ``mamba_chunk_scan_combined``).

``MambaChunkScanCombined(chunk_size, dt_softplus=True, dt_limit=(0.0, inf))``;
``forward(x[T, H, P], dt[T, H], A[H], B[T, G, N], C[T, G, N], cu_seqlens[S + 1], D=None ([H] or
[H, P]), z=None ([T, H, P]), dt_bias=None ([H]), initial_states=None ([S, H, P, N]),
state_dtype=None) -> (out[T, H, P] in x's dtype, varlen_states[S, H, P, N])``.

Per head, with groups of H/G heads sharing B and C, every sequence runs the recurrence
s_t = exp(dt_t A) s_{t-1} + dt_t x_t B_t^T, y_t = s_t C_t + D x_t from its initial state (zero
without one), where dt_t = clamp(softplus(dt_t + dt_bias), dt_limit) (production's prefill clamps
even with the default limit, which keeps a step without softplus from going negative); ``z``
gates y by silu(z). ``varlen_states`` are the states after each sequence's last token, in
``state_dtype`` (default: the initial states' dtype, else float32; float64 for the truth).

vLLM's mixer passes z=None and gates afterwards in its gated RMSNorm, and precomputes chunk
metadata (seq_idx, cu_chunk_seqlens, last_chunk_indices) that is a function of cu_seqlens and
chunk_size alone: this module derives it itself. y is returned, not written into a preallocated
``out``. ``forward_native`` is the token-by-token recurrence (:mod:`kernels_reference.ops.mamba_ssd.native`);
``forward_triton`` the chunked kernels (:mod:`kernels_reference.ops.mamba_ssd.chunk_scan`).

Under ``torch.compile`` the scan is one opaque custom op, ``fk::mamba_chunk_scan_combined`` (vLLM's
mixer is an opaque op around it): the native recurrence walks each sequence's tokens between
``cu_seqlens`` bounds read on the host, which no graph can hold.
"""
import functools
from typing import List, Optional, Sequence, Tuple

import torch
from torch import nn

from ..dispatch import on_meta, op_name, use_fast_path
from ..ops.mamba_ssd import native
from ..records import RecordsInit

try:
    from ..ops.mamba_ssd.chunk_scan import ssd_chunk_scan
except ImportError:  # no Triton: the native path still works
    ssd_chunk_scan = None

_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # float64 (the truth) stays native


class MambaChunkScanCombined(RecordsInit, nn.Module):
    def __init__(self, chunk_size: int, dt_softplus: bool = True,
                 dt_limit: Sequence[float] = (0.0, float("inf"))):
        super().__init__()
        self.chunk_size, self.dt_softplus, self.dt_limit = chunk_size, dt_softplus, tuple(dt_limit)

    def forward(self, x, dt, A, B, C, cu_seqlens, D=None, z=None, dt_bias=None, initial_states=None,
                state_dtype: Optional[torch.dtype] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        args = (x, dt, A, B, C, cu_seqlens, D, z, dt_bias, initial_states, state_dtype)
        if on_meta(x):
            seqs = cu_seqlens.shape[0] - 1
            return (torch.empty_like(x), torch.empty((seqs, *x.shape[1:], B.shape[-1]), device=x.device,
                                                     dtype=state_dtype or torch.float32))
        if torch.compiler.is_compiling():
            return mamba_chunk_scan_combined(x, dt, A, B, C, cu_seqlens, D, z, dt_bias, initial_states, state_dtype,
                                             self.chunk_size, self.dt_softplus, list(self.dt_limit))
        if ssd_chunk_scan is not None and x.dtype in _KERNEL_DTYPES and use_fast_path(x, dt, B, C):
            return self.forward_triton(*args)
        return self.forward_native(*args)

    def forward_native(self, x, dt, A, B, C, cu_seqlens, D=None, z=None, dt_bias=None, initial_states=None,
                       state_dtype=None):
        return native.ssd_scan(x, dt, A, B, C, cu_seqlens, D, z, dt_bias, initial_states, self.dt_softplus,
                               self.dt_limit, state_dtype)

    def forward_triton(self, x, dt, A, B, C, cu_seqlens, D=None, z=None, dt_bias=None, initial_states=None,
                       state_dtype=None):
        return ssd_chunk_scan(x, dt, A, B, C, cu_seqlens, self.chunk_size, D, z, dt_bias, initial_states,
                              self.dt_softplus, self.dt_limit, state_dtype)


# ---- torch.compile: the scan as one custom op ----------------------------------------------------

@functools.lru_cache(maxsize=None)
def _op_layer(chunk_size: int, dt_softplus: bool, dt_limit: Tuple[float, float]) -> MambaChunkScanCombined:
    """The (weightless) module of this configuration the op runs, built on the meta device once: op
    and eager module share one code path, the eager ``forward`` choosing the device's kernels."""
    with torch.device("meta"):
        return MambaChunkScanCombined(chunk_size, dt_softplus, dt_limit)


_OP_NAME = op_name("mamba_chunk_scan_combined", __name__)  # a copy of this file registers its own op


@torch.library.custom_op(_OP_NAME, mutates_args=())
def mamba_chunk_scan_combined(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                              cu_seqlens: torch.Tensor, D: Optional[torch.Tensor], z: Optional[torch.Tensor],
                              dt_bias: Optional[torch.Tensor], initial_states: Optional[torch.Tensor],
                              state_dtype: Optional[torch.dtype], chunk_size: int, dt_softplus: bool,
                              dt_limit: List[float]) -> Tuple[torch.Tensor, torch.Tensor]:
    """``MambaChunkScanCombined.forward`` as an op: (y, each sequence's final state)."""
    layer = _op_layer(chunk_size, dt_softplus, tuple(dt_limit))
    return layer(x, dt, A, B, C, cu_seqlens, D, z, dt_bias, initial_states, state_dtype)


@mamba_chunk_scan_combined.register_fake
def _mamba_chunk_scan_combined_fake(x, dt, A, B, C, cu_seqlens, D, z, dt_bias, initial_states, state_dtype,
                                    chunk_size, dt_softplus, dt_limit):
    # the states' dtype as both paths choose it: asked for, else the initial states', else float32
    # (float64 for the float64 truth, which only the native recurrence computes)
    dtype = state_dtype or (initial_states.dtype if initial_states is not None else
                            torch.float64 if x.dtype == torch.float64 else torch.float32)
    seqs = cu_seqlens.shape[0] - 1
    return x.new_empty(x.shape), x.new_empty((seqs, *x.shape[1:], B.shape[-1]), dtype=dtype)
