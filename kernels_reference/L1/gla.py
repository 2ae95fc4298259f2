"""ChunkGLA: the gated linear attention core of GLA models (fla-hub/gla-1.3B-100B), with
flash-linear-attention's interface (``chunk_gla`` for prefill, ``fused_recurrent_gla`` for decode;
FLA's ``GatedLinearAttention`` layer calls the one or the other).

``ChunkGLA()``; ``forward(q, k, v, g, scale=None, initial_state=None, output_final_state=False,
cu_seqlens=None) -> (o, final_state)``:

* q, k [B, T, H, K]; v [B, T, H, V]; g [B, T, H, K] the per-key-channel log-space decay (<= 0;
  the layer gives logsigmoid(gk_proj(x)) / 16). ``chunk_gla`` names it ``g``,
  ``fused_recurrent_gla`` ``gk``. Variable-length batches are packed: B = 1 and ``cu_seqlens``
  [N + 1] marks the N sequences; without it the B rows are the sequences.
* ``scale`` defaults to K ** -0.5.
* ``initial_state`` [N, H, K, V] float32 or None (zeros), FLA's default [K, V] state layout (its
  ``state_v_first`` transposed layout is not taken); ``o`` [B, T, H, V] in v's dtype and, with
  ``output_final_state``, the float32 states after each sequence's last token, else None.

Per head and sequence (ops/gla/native.py): S <- diag(exp(g_t)) S + k_t v_t^T, then
o_t = S^T (q_t scale): the output reads the state after the token's own write.

Fast path: the recurrent Triton kernel when every sequence brings one token (decode: the state is
read and written once), the chunked kernels (64-token chunks, 16-token sub-chunks for the
per-channel decay, float32 state carried across chunks) otherwise.

Under ``torch.compile`` the call is one opaque custom op, ``fk::chunk_gla``: the native recurrence
walks each sequence's tokens between ``cu_seqlens`` bounds read on the host, which no graph can
hold. An op cannot return None, so without ``output_final_state`` it returns an empty state that
``forward`` maps back to None.
"""
import functools
from typing import Optional, Tuple

import torch
from torch import nn

from ..dispatch import on_meta, op_name, use_fast_path
from ..ops.gla.native import gla_recurrence
from ..ops.gated_delta.layout import packed_batch
from ..records import RecordsInit

try:
    import triton
except ImportError:
    triton = None


class ChunkGLA(RecordsInit, nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                scale: Optional[float] = None, initial_state: Optional[torch.Tensor] = None,
                output_final_state: bool = False, cu_seqlens: Optional[torch.Tensor] = None
                ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        if on_meta(q, k, v):
            n = q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
            final = (torch.empty((n, v.shape[2], k.shape[-1], v.shape[-1]), dtype=torch.float32, device=v.device)
                     if output_final_state else None)
            return torch.empty_like(v), final
        if torch.compiler.is_compiling():
            o, final = chunk_gla(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens)
            return o, (final if output_final_state else None)
        if triton is not None and use_fast_path(q, k, v, g, initial_state):
            return self.forward_triton(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens)
        return self.forward_native(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens)

    def forward_native(self, q, k, v, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
        shape = v.shape
        (q, k, v, g), cu_seqlens = packed_batch((q, k, v, g), cu_seqlens)
        o, final = gla_recurrence(q[0], k[0], v[0], g[0], _scale(scale, k), initial_state, cu_seqlens)
        return o.to(v.dtype).reshape(shape), (final if output_final_state else None)

    def forward_triton(self, q, k, v, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
        from ..ops.gated_delta.layout import token_heads
        from ..ops.gla.chunk import chunk_forward
        from ..ops.gla.recurrent import recurrent_forward

        shape = v.shape
        (q, k, v, g), cu_seqlens = packed_batch((q, k, v, g), cu_seqlens)
        _check(q, k, v, g, initial_state, cu_seqlens)
        if initial_state is not None:
            initial_state = initial_state.to(torch.float32).contiguous()
        cu_seqlens = cu_seqlens.to(torch.int32)
        # Decode: one token per sequence (T == N) needs no chunking; the state is streamed once.
        step = recurrent_forward if q.shape[1] == cu_seqlens.numel() - 1 else chunk_forward
        o, final = step(token_heads(q), token_heads(k), token_heads(v), token_heads(g), _scale(scale, k),
                        initial_state, cu_seqlens, output_final_state)
        return o.reshape(shape), final


def _scale(scale, k):
    return k.shape[-1] ** -0.5 if scale is None else float(scale)


def _check(q, k, v, g, initial_state, cu_seqlens):
    if k.shape != q.shape or g.shape != q.shape or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"shapes q {tuple(q.shape)} k {tuple(k.shape)} g {tuple(g.shape)} v {tuple(v.shape)} "
                         f"do not match [1, T, H, K] / [1, T, H, V]")
    kd = q.shape[-1]
    if kd > 256:
        raise ValueError(f"key head dim {kd} > 256: the decode kernel keeps a whole state column in registers")
    n, heads = cu_seqlens.numel() - 1, q.shape[2]
    if initial_state is not None and tuple(initial_state.shape) != (n, heads, kd, v.shape[-1]):
        raise ValueError(f"initial_state {tuple(initial_state.shape)} is not [N={n}, H, K, V]")


# ---- torch.compile: the call as one custom op ----------------------------------------------------

@functools.lru_cache(maxsize=None)
def _op_layer() -> ChunkGLA:
    """The (weightless) module the op runs, built on the meta device once: op and eager module
    share one code path, the eager ``forward`` choosing the device's kernels."""
    with torch.device("meta"):
        return ChunkGLA()


_OP_NAME = op_name("chunk_gla", __name__)  # a copy of this file registers its own op


@torch.library.custom_op(_OP_NAME, mutates_args=())
def chunk_gla(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, scale: Optional[float],
              initial_state: Optional[torch.Tensor], output_final_state: bool, cu_seqlens: Optional[torch.Tensor]
              ) -> Tuple[torch.Tensor, torch.Tensor]:
    """``ChunkGLA.forward`` as an op: (o, final states), the states empty when not asked for."""
    o, final = _op_layer()(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens)
    return o, (final if final is not None else v.new_empty(0, dtype=torch.float32))


@chunk_gla.register_fake
def _chunk_gla_fake(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens):
    if not output_final_state:
        return v.new_empty(v.shape), v.new_empty(0, dtype=torch.float32)
    # [N, H, K, V] in float32 (float64 for the float64 truth, which only the native recurrence computes)
    n = q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    dtype = torch.float64 if v.dtype == torch.float64 else torch.float32
    return v.new_empty(v.shape), v.new_empty((n, v.shape[2], k.shape[-1], v.shape[-1]), dtype=dtype)
