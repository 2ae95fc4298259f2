"""GatedDeltaRule: the linear-attention core of Qwen3-Next's gated DeltaNet layers, with
flash-linear-attention's interface (``chunk_gated_delta_rule`` for prefill,
``fused_recurrent_gated_delta_rule`` for decode; vLLM's Qwen3-Next calls the same two).

``GatedDeltaRule()``; ``forward(q, k, v, g, beta, scale=None, initial_state=None,
output_final_state=False, use_qk_l2norm_in_kernel=False, cu_seqlens=None) -> (o, final_state)``:

* q, k [B, T, Hk, K]; v [B, T, Hv, V] with Hv a multiple of Hk (value head h reads key head
  h // (Hv // Hk)); g [B, T, Hv] the log-space decay (<= 0); beta [B, T, Hv] in (0, 1).
  Variable-length batches are packed: B = 1 and ``cu_seqlens`` [N + 1] (int32) marks the N
  sequences; without it the B rows are the sequences.
* ``scale`` defaults to K ** -0.5; ``use_qk_l2norm_in_kernel`` normalises q and k per head first
  (Qwen3-Next sets it).
* ``initial_state`` [N, Hv, K, V] float32 or None (zeros); ``o`` [B, T, Hv, V] in v's dtype and,
  with ``output_final_state``, the float32 states after each sequence's last token, else None.

Per value head and sequence (see ops/gated_delta/native.py for the exact order): decay the state
by exp(g_t), compute the delta v'_t = beta_t (v_t - S^T k_t), add k_t v'_t^T, read o_t = S^T q_t
scale.

Fast path: the recurrent Triton kernel when every sequence brings one token (decode: the state is
read and written once), the chunked kernels (64-token chunks, UT transform, float32 state carried
across chunks) otherwise.

Under ``torch.compile`` the call is one opaque custom op, ``fk::gated_delta_rule`` (vLLM's gated
DeltaNet layer is opaque the same way): the native recurrence walks each sequence's tokens between
``cu_seqlens`` bounds read on the host, which no graph can hold. An op cannot return None, so
without ``output_final_state`` it returns an empty state that ``forward`` maps back to None.
"""
import functools
from typing import Optional, Tuple

import torch
from torch import nn

from ..dispatch import on_meta, op_name, use_fast_path
from ..ops.gated_delta.native import gated_delta_rule_recurrence
from ..ops.gated_delta.layout import packed_batch
from ..records import RecordsInit

try:
    import triton
except ImportError:
    triton = None


class GatedDeltaRule(RecordsInit, nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                scale: Optional[float] = None, initial_state: Optional[torch.Tensor] = None,
                output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
                cu_seqlens: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        if on_meta(q, k, v):
            n = q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
            final = (torch.empty((n, v.shape[2], k.shape[-1], v.shape[-1]), dtype=torch.float32, device=v.device)
                     if output_final_state else None)
            return torch.empty_like(v), final
        if torch.compiler.is_compiling():
            o, final = gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state,
                                        use_qk_l2norm_in_kernel, cu_seqlens)
            return o, (final if output_final_state else None)
        if triton is not None and use_fast_path(q, k, v, g, beta, initial_state):
            return self.forward_triton(q, k, v, g, beta, scale, initial_state, output_final_state,
                                       use_qk_l2norm_in_kernel, cu_seqlens)
        return self.forward_native(q, k, v, g, beta, scale, initial_state, output_final_state,
                                   use_qk_l2norm_in_kernel, cu_seqlens)

    def forward_native(self, q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                       use_qk_l2norm_in_kernel=False, cu_seqlens=None):
        shape = v.shape
        (q, k, v, g, beta), cu_seqlens = packed_batch((q, k, v, g, beta), cu_seqlens)
        o, final = gated_delta_rule_recurrence(q[0], k[0], v[0], g[0], beta[0], _scale(scale, k), initial_state,
                                               cu_seqlens, use_qk_l2norm_in_kernel)
        return o.to(v.dtype).reshape(shape), (final if output_final_state else None)

    def forward_triton(self, q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                       use_qk_l2norm_in_kernel=False, cu_seqlens=None):
        from ..ops.gated_delta.chunk import chunk_forward
        from ..ops.gated_delta.layout import token_heads
        from ..ops.gated_delta.recurrent import recurrent_forward

        shape = v.shape
        (q, k, v, g, beta), cu_seqlens = packed_batch((q, k, v, g, beta), cu_seqlens)
        _check(q, k, v, g, beta, initial_state, cu_seqlens)
        if initial_state is not None:
            initial_state = initial_state.to(torch.float32).contiguous()
        cu_seqlens = cu_seqlens.to(torch.int32)
        # Decode: one token per sequence (T == N) needs no chunking; the state is streamed once.
        step = recurrent_forward if q.shape[1] == cu_seqlens.numel() - 1 else chunk_forward
        o, final = step(token_heads(q), token_heads(k), token_heads(v), token_heads(g), token_heads(beta),
                        _scale(scale, k), initial_state, cu_seqlens, output_final_state, use_qk_l2norm_in_kernel)
        return o.reshape(shape), final


def _scale(scale, k):
    return k.shape[-1] ** -0.5 if scale is None else float(scale)


def _check(q, k, v, g, beta, initial_state, cu_seqlens):
    t, hk, kd = q.shape[1:]
    hv = v.shape[2]
    if k.shape != q.shape or v.shape[:2] != q.shape[:2] or g.shape != v.shape[:3] or beta.shape != v.shape[:3]:
        raise ValueError(f"shapes q {tuple(q.shape)} k {tuple(k.shape)} v {tuple(v.shape)} g {tuple(g.shape)} "
                         f"beta {tuple(beta.shape)} do not match [1, T, Hk, K] / [1, T, Hv, V] / [1, T, Hv]")
    if hv % hk:
        raise ValueError(f"{hv} value heads are not a multiple of {hk} key heads")
    if kd > 256:
        raise ValueError(f"key head dim {kd} > 256: a state row block would not fit the kernels' registers")
    n = cu_seqlens.numel() - 1
    if initial_state is not None and tuple(initial_state.shape) != (n, hv, kd, v.shape[-1]):
        raise ValueError(f"initial_state {tuple(initial_state.shape)} is not [N={n}, Hv, K, V]")


# ---- torch.compile: the call as one custom op ----------------------------------------------------

@functools.lru_cache(maxsize=None)
def _op_layer() -> GatedDeltaRule:
    """The (weightless) module the op runs, built on the meta device once: op and eager module
    share one code path, the eager ``forward`` choosing the device's kernels."""
    with torch.device("meta"):
        return GatedDeltaRule()


_OP_NAME = op_name("gated_delta_rule", __name__)  # a copy of this file registers its own op


@torch.library.custom_op(_OP_NAME, mutates_args=())
def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     scale: Optional[float], initial_state: Optional[torch.Tensor], output_final_state: bool,
                     use_qk_l2norm_in_kernel: bool, cu_seqlens: Optional[torch.Tensor]
                     ) -> Tuple[torch.Tensor, torch.Tensor]:
    """``GatedDeltaRule.forward`` as an op: (o, final states), the states empty when not asked for."""
    o, final = _op_layer()(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                           cu_seqlens)
    return o, (final if final is not None else v.new_empty(0, dtype=torch.float32))


@gated_delta_rule.register_fake
def _gated_delta_rule_fake(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                           cu_seqlens):
    return v.new_empty(v.shape), _final_state_like(q, k, v, output_final_state, cu_seqlens)


def _final_state_like(q, k, v, output_final_state, cu_seqlens):
    """The final states' shape and dtype: [N, Hv, K, V] in float32 (float64 for the float64 truth,
    which only the native recurrence computes); empty when not asked for."""
    if not output_final_state:
        return v.new_empty(0, dtype=torch.float32)
    n = q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    dtype = torch.float64 if v.dtype == torch.float64 else torch.float32
    return v.new_empty((n, v.shape[2], k.shape[-1], v.shape[-1]), dtype=dtype)
