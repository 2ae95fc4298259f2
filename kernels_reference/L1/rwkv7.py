"""ChunkRWKV7: the time-mix core of RWKV-7 ("Goose") models (RWKV-7 World 2.9B, fla-hub's
rwkv7-2.9B-world), with flash-linear-attention's interface (``chunk_rwkv7`` for prefill,
``fused_recurrent_rwkv7`` with the same arguments; FLA's ``RWKV7Attention`` layer calls the one or
a fused-multiply recurrent variant of the other).

``ChunkRWKV7()``; ``forward(r, w, k, v, a, b, scale=1.0, initial_state=None,
output_final_state=False, cu_seqlens=None) -> (o, final_state)``:

* r, w, k, a, b [B, T, H, K]; v [B, T, H, V] (FLA's [B, T, H, ...] layout; the head-first one is
  gone from FLA and not taken). ``w`` is the per-key-channel *log* decay (<= 0; the layer gives
  -exp(-0.5) * sigmoid(w0 + lora), in (-0.607, 0)). ``a`` and ``b`` make the state's rank-one
  correction; the layer passes a = -kk and b = kk * iclr (kk the L2-normalised key, iclr the
  in-context learning rate in (0, 1)). Variable-length batches are packed: B = 1 and
  ``cu_seqlens`` [N + 1] marks the N sequences; without it the B rows are the sequences.
* ``scale`` defaults to 1.0, ``chunk_rwkv7``'s default and what the layer passes to both ops
  (``fused_recurrent_rwkv7`` alone defaults to None); None means K ** -0.5, as there.
* ``initial_state`` [N, H, K, V] float32 or None (zeros); ``o`` [B, T, H, V] in v's dtype and,
  with ``output_final_state``, the float32 states after each sequence's last token, else None.

Per head and sequence (ops/rwkv7/native.py): S <- diag(exp(w_t)) S + b_t (a_t^T S) + k_t v_t^T,
the correction reading the state before the token's decay, then o_t = S^T (r_t scale): the output
reads the state after the token's own write.

Fast path: the recurrent Triton kernel (ops/rwkv7/recurrent.py: a state slice per program in
registers, tokens in order) for decode; prefill runs the chunked kernels of ops/rwkv7/chunk.py
(16-token chunks, the DPLR form FLA's ``chunk_rwkv7`` also uses, with bf16 products) unless
``ops.rwkv7.chunk.PREFILL_CHUNKED`` is switched off. The chunked form sets the task's bar where
production's numerics are (that file says why); it matches the recurrence on the CPU and has not
run on a GPU yet (the recurrent prefill took 38.6 ms for 32768 tokens on an H100, 2026-12-05).

Under ``torch.compile`` the call is one opaque custom op, ``fk::chunk_rwkv7``: the native
recurrence walks each sequence's tokens between ``cu_seqlens`` bounds read on the host, which no
graph can hold. An op cannot return None, so without ``output_final_state`` it returns an empty
state that ``forward`` maps back to None.
"""
import functools
from typing import Optional, Tuple

import torch
from torch import nn

from ..dispatch import on_meta, op_name, use_fast_path
from ..ops.gated_delta.layout import packed_batch
from ..ops.rwkv7.native import rwkv7_recurrence
from ..records import RecordsInit

try:
    import triton
except ImportError:
    triton = None


class ChunkRWKV7(RecordsInit, nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, r: torch.Tensor, w: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor,
                b: torch.Tensor, scale: Optional[float] = 1.0, initial_state: Optional[torch.Tensor] = None,
                output_final_state: bool = False, cu_seqlens: Optional[torch.Tensor] = None
                ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        if on_meta(r, k, v):
            n = r.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
            final = (torch.empty((n, v.shape[2], k.shape[-1], v.shape[-1]), dtype=torch.float32, device=v.device)
                     if output_final_state else None)
            return torch.empty_like(v), final
        if torch.compiler.is_compiling():
            o, final = chunk_rwkv7(r, w, k, v, a, b, scale, initial_state, output_final_state, cu_seqlens)
            return o, (final if output_final_state else None)
        if triton is not None and use_fast_path(r, w, k, v, a, b, initial_state):
            return self.forward_triton(r, w, k, v, a, b, scale, initial_state, output_final_state, cu_seqlens)
        return self.forward_native(r, w, k, v, a, b, scale, initial_state, output_final_state, cu_seqlens)

    def forward_native(self, r, w, k, v, a, b, scale=1.0, initial_state=None, output_final_state=False,
                       cu_seqlens=None):
        shape = v.shape
        (r, w, k, v, a, b), cu_seqlens = packed_batch((r, w, k, v, a, b), cu_seqlens)
        o, final = rwkv7_recurrence(r[0], w[0], k[0], v[0], a[0], b[0], _scale(scale, k), initial_state, cu_seqlens)
        return o.to(v.dtype).reshape(shape), (final if output_final_state else None)

    def forward_triton(self, r, w, k, v, a, b, scale=1.0, initial_state=None, output_final_state=False,
                       cu_seqlens=None):
        from ..ops.gated_delta.layout import token_heads
        from ..ops.rwkv7 import chunk
        from ..ops.rwkv7.recurrent import recurrent_forward

        shape = v.shape
        (r, w, k, v, a, b), cu_seqlens = packed_batch((r, w, k, v, a, b), cu_seqlens)
        _check(r, w, k, v, a, b, initial_state, cu_seqlens)
        if initial_state is not None:
            initial_state = initial_state.to(torch.float32).contiguous()
        # decode (one token per sequence) always walks tokens; prefill may take the chunked kernels
        decoding = r.shape[1] == cu_seqlens.numel() - 1
        step = chunk.chunk_forward if chunk.PREFILL_CHUNKED and not decoding else recurrent_forward
        o, final = step(*(token_heads(x) for x in (r, w, k, v, a, b)), _scale(scale, k),
                        initial_state, cu_seqlens.to(torch.int32), output_final_state)
        return o.reshape(shape), final


def _scale(scale, k):
    return k.shape[-1] ** -0.5 if scale is None else float(scale)


def _check(r, w, k, v, a, b, initial_state, cu_seqlens):
    from ..ops.rwkv7.recurrent import MAX_KEY_DIM

    if any(x.shape != r.shape for x in (w, k, a, b)) or v.shape[:3] != r.shape[:3]:
        raise ValueError(f"shapes r {tuple(r.shape)} w {tuple(w.shape)} k {tuple(k.shape)} a {tuple(a.shape)} "
                         f"b {tuple(b.shape)} v {tuple(v.shape)} do not match [1, T, H, K] / [1, T, H, V]")
    kd = r.shape[-1]
    if kd > MAX_KEY_DIM:
        raise ValueError(f"key head dim {kd} > {MAX_KEY_DIM}: the kernel keeps a whole state column in registers")
    n, heads = cu_seqlens.numel() - 1, r.shape[2]
    if initial_state is not None and tuple(initial_state.shape) != (n, heads, kd, v.shape[-1]):
        raise ValueError(f"initial_state {tuple(initial_state.shape)} is not [N={n}, H, K, V]")


# ---- torch.compile: the call as one custom op ----------------------------------------------------

@functools.lru_cache(maxsize=None)
def _op_layer() -> ChunkRWKV7:
    """The (weightless) module the op runs, built on the meta device once: op and eager module
    share one code path, the eager ``forward`` choosing the device's kernels."""
    with torch.device("meta"):
        return ChunkRWKV7()


_OP_NAME = op_name("chunk_rwkv7", __name__)  # a copy of this file registers its own op


@torch.library.custom_op(_OP_NAME, mutates_args=())
def chunk_rwkv7(r: torch.Tensor, w: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor,
                b: torch.Tensor, scale: Optional[float], initial_state: Optional[torch.Tensor],
                output_final_state: bool, cu_seqlens: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """``ChunkRWKV7.forward`` as an op: (o, final states), the states empty when not asked for."""
    o, final = _op_layer()(r, w, k, v, a, b, scale, initial_state, output_final_state, cu_seqlens)
    return o, (final if final is not None else v.new_empty(0, dtype=torch.float32))


@chunk_rwkv7.register_fake
def _chunk_rwkv7_fake(r, w, k, v, a, b, scale, initial_state, output_final_state, cu_seqlens):
    if not output_final_state:
        return v.new_empty(v.shape), v.new_empty(0, dtype=torch.float32)
    # [N, H, K, V] in float32 (float64 for the float64 truth, which only the native recurrence computes)
    n = r.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    dtype = torch.float64 if v.dtype == torch.float64 else torch.float32
    return v.new_empty(v.shape), v.new_empty((n, v.shape[2], k.shape[-1], v.shape[-1]), dtype=dtype)
