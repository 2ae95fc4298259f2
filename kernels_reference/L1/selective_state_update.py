"""SelectiveStateUpdate: Mamba-2's decode step, as vLLM's ``MambaMixer2`` calls
``selective_state_update`` (mamba-ssm's kernel of that name).

``SelectiveStateUpdate(dt_softplus=True)``; ``forward(state[pool, H, P, N], x[B, H, P], dt[B, H, P],
A[H, P, N], B[B, G, N], C[B, G, N], D=None ([H, P]), z=None ([B, H, P]), dt_bias=None ([H, P]),
state_batch_indices=None ([B] int32)) -> y[B, H, P]`` in x's dtype.

Row b advances the state in pool slot ``state_batch_indices[b]`` (slot b without indices) by one
token, **in place**: s = exp(dt A) s + dt x B^T with dt = softplus(dt + dt_bias) (no clamp, as in
production's decode kernel), y = s C + D x, gated by silu(z) when z is given; the other slots are
left untouched. Groups of H/G heads share B and C. vLLM keeps per-head dt, A, D and dt_bias and
broadcasts them over head_dim (stride-0 views) for this call; the slot pool holds the state in the
cache's dtype (float32 in these tasks).

``forward_native`` is the recurrence's step in PyTorch (:mod:`kernels_reference.ops.mamba_ssd.native`);
``forward_triton`` the fused kernel (:mod:`kernels_reference.ops.mamba_ssd.state_update`).

Under ``torch.compile`` the step is one opaque custom op, ``fk::selective_state_update``, with the
slot pool a declared mutation (vLLM's mixer is an opaque op around its kernel): the native step
traces, but the fused kernel is what production runs there, and one op keeps the compiled graph's
path the eager one.
"""
import functools
from typing import Optional

import torch
from torch import nn

from ..dispatch import on_meta, op_name, use_fast_path
from ..ops.mamba_ssd import native
from ..records import RecordsInit

try:
    from ..ops.mamba_ssd.state_update import selective_state_update
except ImportError:  # no Triton: the native path still works
    selective_state_update = None

_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # float64 (the truth) stays native


class SelectiveStateUpdate(RecordsInit, nn.Module):
    def __init__(self, dt_softplus: bool = True):
        super().__init__()
        self.dt_softplus = dt_softplus

    def forward(self, state, x, dt, A, B, C, D=None, z=None, dt_bias=None, state_batch_indices=None):
        args = (state, x, dt, A, B, C, D, z, dt_bias, state_batch_indices)
        if on_meta(x):
            return torch.empty_like(x)
        if torch.compiler.is_compiling():
            return selective_state_update_op(state, x, dt, A, B, C, D, z, dt_bias, state_batch_indices,
                                             self.dt_softplus)
        if selective_state_update is not None and x.dtype in _KERNEL_DTYPES and state.dtype in _KERNEL_DTYPES \
                and use_fast_path(state, x):
            return self.forward_triton(*args)
        return self.forward_native(*args)

    def forward_native(self, state, x, dt, A, B, C, D=None, z=None, dt_bias=None, state_batch_indices=None):
        return native.state_update(state, x, dt, A, B, C, D, z, dt_bias, self.dt_softplus, state_batch_indices)

    def forward_triton(self, state, x, dt, A, B, C, D=None, z=None, dt_bias=None, state_batch_indices=None):
        return selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, self.dt_softplus, state_batch_indices)


# ---- torch.compile: the step as one custom op ----------------------------------------------------

@functools.lru_cache(maxsize=None)
def _op_layer(dt_softplus: bool) -> SelectiveStateUpdate:
    """The (weightless) module of this configuration the op runs, built on the meta device once: op
    and eager module share one code path, the eager ``forward`` choosing the device's kernel."""
    with torch.device("meta"):
        return SelectiveStateUpdate(dt_softplus)


_OP_NAME = op_name("selective_state_update", __name__)  # a copy of this file registers its own op


@torch.library.custom_op(_OP_NAME, mutates_args=("state",))
def selective_state_update_op(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                              B: torch.Tensor, C: torch.Tensor, D: Optional[torch.Tensor], z: Optional[torch.Tensor],
                              dt_bias: Optional[torch.Tensor], state_batch_indices: Optional[torch.Tensor],
                              dt_softplus: bool) -> torch.Tensor:
    """``SelectiveStateUpdate.forward`` as an op: advance the named slots in place, return y."""
    return _op_layer(dt_softplus)(state, x, dt, A, B, C, D, z, dt_bias, state_batch_indices)


@selective_state_update_op.register_fake
def _selective_state_update_fake(state, x, dt, A, B, C, D, z, dt_bias, state_batch_indices, dt_softplus):
    return x.new_empty(x.shape)  # contiguous, as both paths return it
