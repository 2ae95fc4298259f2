"""ShortConvolution: the causal depthwise 1-D convolution (kernel 4, SiLU) that Mamba-2 runs on its
packed (x, B, C) channels and Qwen3-Next's gated DeltaNet on its (q, k, v) channels.

The class keeps flash-linear-attention's name and constructor (``ShortConvolution(hidden_size,
kernel_size, bias, activation)``, weight ``[D, 1, K]`` as ``nn.Conv1d`` holds it, so HF checkpoints
load unchanged); ``forward`` takes the arguments of vLLM's two ops, one call per phase:

* prefill (vLLM ``causal_conv1d_fn``): ``x [T, D]`` packs the tokens of several sequences,
  ``query_start_loc [B + 1]`` (int32 cu_seqlens) delimits them; sequence ``b`` uses state slot
  ``cache_indices[b]`` of the pool, starts from that slot's window where ``has_initial_state[b]``
  (a prefill continuing an earlier chunk) and from zeros otherwise, and writes its last ``K - 1``
  window rows back to the slot.
* decode (vLLM ``causal_conv1d_update``, ``query_start_loc`` omitted): ``x [B, D]``, one new token
  per sequence, always continuing the slot's state, which moves up one row in place.

``conv_states [slots, K - 1, D]`` is the layer's pool (channels contiguous: vLLM's ``(slots, D,
K - 1)`` view is a transpose of this same storage); it is an in-place output, and slots not named
in ``cache_indices`` are left untouched. ``cache_indices`` omitted means slot ``b`` for sequence ``b``.
Padded batch entries (vLLM's ``PAD_SLOT_ID``) are not supported: every entry is a real sequence.

Under ``torch.compile`` the layer is one opaque custom op, ``fk::short_convolution`` (vLLM's
causal_conv1d ops sit inside its opaque mamba / gated-DeltaNet layer ops): the native path plans
its windows per sequence from ``query_start_loc`` and ``cache_indices`` on the host, which no graph
can hold, and the pool update is a declared mutation of ``conv_states``.
"""
import functools
from typing import Optional

import torch
from torch import nn

from ..dispatch import on_meta, op_name, use_fast_path
from ..ops.short_conv.kernels import short_conv_decode, short_conv_prefill, triton
from ..ops.short_conv.native import short_conv_native
from ..records import RecordsInit


class ShortConvolution(RecordsInit, nn.Module):
    def __init__(self, hidden_size: int, kernel_size: int = 4, bias: bool = False,
                 activation: Optional[str] = "silu"):
        super().__init__()
        if activation not in (None, "silu", "swish"):
            raise ValueError(f"ShortConvolution supports SiLU or no activation, not {activation!r}")
        self.hidden_size, self.kernel_size, self.activation = hidden_size, kernel_size, activation
        self.weight = nn.Parameter(torch.empty(hidden_size, 1, kernel_size))
        self.bias = nn.Parameter(torch.zeros(hidden_size)) if bias else None
        nn.init.uniform_(self.weight, -kernel_size ** -0.5, kernel_size ** -0.5)

    def forward(self, x: torch.Tensor, conv_states: torch.Tensor,
                query_start_loc: Optional[torch.Tensor] = None, cache_indices: Optional[torch.Tensor] = None,
                has_initial_state: Optional[torch.Tensor] = None) -> torch.Tensor:
        if on_meta(x, conv_states):
            return torch.empty_like(x)
        self._check(x, conv_states)
        if torch.compiler.is_compiling():
            return short_convolution(x, conv_states, self.weight, self.bias, query_start_loc, cache_indices,
                                     has_initial_state, self.activation)
        if triton is not None and use_fast_path(x, conv_states):
            return self.forward_triton(x, conv_states, query_start_loc, cache_indices, has_initial_state)
        return self.forward_native(x, conv_states, query_start_loc, cache_indices, has_initial_state)

    def forward_native(self, x, conv_states, query_start_loc=None, cache_indices=None, has_initial_state=None):
        if query_start_loc is None:  # decode: a one-token sequence per row, continuing its state
            query_start_loc = torch.arange(x.shape[0] + 1, dtype=torch.int32, device=x.device)
            has_initial_state = torch.ones(x.shape[0], dtype=torch.bool, device=x.device)
        return short_conv_native(x, self.weight[:, 0, :], self.bias, conv_states, query_start_loc,
                                 cache_indices, has_initial_state, self.activation)

    def forward_triton(self, x, conv_states, query_start_loc=None, cache_indices=None, has_initial_state=None):
        weight = self.weight[:, 0, :]
        if query_start_loc is None:
            return short_conv_decode(x, weight, self.bias, conv_states, cache_indices, self.activation)
        return short_conv_prefill(x, weight, self.bias, conv_states, query_start_loc, cache_indices,
                                  has_initial_state, self.activation)

    def _check(self, x, conv_states):
        if x.dim() != 2 or x.shape[1] != self.hidden_size:
            raise ValueError(f"ShortConvolution({self.hidden_size}) expects x [tokens, {self.hidden_size}], "
                             f"got {tuple(x.shape)}")
        if conv_states.dim() != 3 or tuple(conv_states.shape[1:]) != (self.kernel_size - 1, self.hidden_size):
            raise ValueError(f"conv_states must be [slots, {self.kernel_size - 1}, {self.hidden_size}], "
                             f"got {tuple(conv_states.shape)}")


# ---- torch.compile: the layer's work as one custom op --------------------------------------------

@functools.lru_cache(maxsize=None)
def _op_layer(hidden_size: int, kernel_size: int, bias: bool, activation: Optional[str]) -> ShortConvolution:
    """A weightless layer of this shape (built on the meta device, once): the op runs its eager
    ``forward`` with the op's weights bound in, so op and eager module share one code path."""
    with torch.device("meta"):
        return ShortConvolution(hidden_size, kernel_size, bias, activation)


_OP_NAME = op_name("short_convolution", __name__)  # a copy of this file registers its own op


@torch.library.custom_op(_OP_NAME, mutates_args=("conv_states",))
def short_convolution(x: torch.Tensor, conv_states: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                      query_start_loc: Optional[torch.Tensor], cache_indices: Optional[torch.Tensor],
                      has_initial_state: Optional[torch.Tensor], activation: Optional[str]) -> torch.Tensor:
    """``ShortConvolution.forward`` as an op: convolve each sequence, update its slot in the pool."""
    hidden_size, _, kernel_size = weight.shape
    layer = _op_layer(hidden_size, kernel_size, bias is not None, activation)
    params = {"weight": weight} if bias is None else {"weight": weight, "bias": bias}
    return torch.func.functional_call(layer, params, (x, conv_states, query_start_loc, cache_indices,
                                                      has_initial_state))


@short_convolution.register_fake
def _short_convolution_fake(x, conv_states, weight, bias, query_start_loc, cache_indices, has_initial_state,
                            activation):
    return x.new_empty(x.shape)  # contiguous, as both paths return it
