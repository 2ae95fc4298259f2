"""Multi-head latent attention (DeepSeek-V2) over a paged latent cache, as vLLM's ``MLAAttention``.

``MLAAttention(num_heads, scale, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, kv_lora_rank)``;
``forward(q[T, H*(nope+rope)], kv_c_normed[T, kv_lora_rank], k_pe[T, rope]) -> [T, H*v_head_dim]``.
``q`` is already rope-rotated in its last ``rope`` features per head, ``kv_c_normed`` is the
normalised latent and ``k_pe`` the rotated rope key shared by all heads. The layer owns
``kv_b_proj`` (weight [H*(nope+v), kv_lora_rank], HF's name): it expands a latent row into each
head's no-rope key and value, ``k_nope[h] = W_UK[h] · c`` and ``v[h] = W_UV[h] · c``.

Cache. ``kv_cache`` [num_blocks, block_size, kv_lora_rank + rope], bound by the model runner, holds
``[kv_c_normed | k_pe]`` per token: one row for all heads (576 values for DeepSeek-V2, against
2 * 16 * 192 for the expanded keys and values). The step's rows are stored at ``slot_mapping``
(slot < 0: padding, skipped), then each sequence's queries attend causally to its whole history
through its block table (metadata from the forward context). Without a cache the layer attends
within each packed sequence (context must be 0); without metadata the batch is one sequence.

Semantics (``forward_native``, float64-capable): expand each sequence's history through
``kv_b_proj``, keys ``[k_nope | k_pe]`` per head, plain causal softmax attention with ``scale``.

Fast path (CUDA; under ``TRITON_INTERPRET=1`` also CPU tensors via ``forward_fast``):

* store: a Triton copy kernel (no host sync; padded slots skipped);
* decode rows: the *absorbed* form. ``q_nope · k_nope = (q_nope · W_UK) · c``, so each head's query
  is moved into latent space once per step (a [H, B, nope] x [H, nope, R] batched GEMM), the Triton
  split-K kernel of :mod:`kernels_reference.ops.mla_decode.decode` scores it against the cached latent + rope rows and sums the
  latent rows themselves (the "values"), its merge kernel combines the splits, and ``W_UV`` lifts
  the latent output back per head (a second batched GEMM). Four launches with the store; the
  cache is read once as it sits (1152 bytes per token in bf16), never expanded;
* prefill rows: expanded, then SDPA. Prefill is compute-bound: per (query, key) pair the expanded
  form does (nope + rope) + v = 320 multiply-adds per head, the absorbed one (R + rope) + R = 1088,
  and the expansion GEMM (2 R H (nope + v) per key) is amortised over the chunk's queries. V stays
  128 wide and a chunk's bottom-right mask is explicit (``PREFILL``: on the H200 the V zero-pad to
  192 that FlashAttention needs cost more than torch's choice for unequal head sizes).

Under ``torch.compile`` a layer with metadata is one opaque custom op, ``fk::mla_attention`` (as
``fk::paged_attention`` and vLLM's attention ops): the per-sequence loop plans from host lengths and
the store writes the cache in place. It takes the metadata's tensors and ``kv_b_proj``'s weight,
mutates the latent cache, and runs this eager ``forward`` for the device when it runs; a composed
candidate ``kv_b_proj`` is therefore bypassed inside a compiled graph (it applies in eager runs).
"""
import dataclasses
import functools
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..dispatch import on_meta, op_name, use_fast_path
from ..forward_context import AttentionMetadata, get_forward_context, set_forward_context
from ..native import run
from ..records import RecordsInit
from ..ops.attention.native import causal_attention, gather_kv
from .attention import _step_metadata
from .linear import ColumnParallelLinear

try:
    import triton
except ImportError:  # the native path still works without Triton
    triton = None

_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # float64 (the truth) stays native


@dataclasses.dataclass(frozen=True)
class MLAPrefillConfig:
    """How the expanded prefill calls SDPA (benchmarks/mla.py times every combination)."""

    pad_v: bool = False  # zero-pad V 128 -> 192 so FlashAttention (equal head sizes only) takes it
    # A chunk with context: "bool" (explicit bottom-right mask) or "lower-right-bias". Measured on the
    # H200 (docs/perf/h200-mla.md): the bias form is the faster, 241 us against 495 (B1 Q2048) and
    # 388 against 681 (Q1024 after 3072 cached).
    mask: str = "lower-right-bias"

    def __post_init__(self):
        if self.mask not in ("bool", "lower-right-bias"):
            raise ValueError(f"unknown prefill mask {self.mask!r}")


PREFILL = MLAPrefillConfig()


class MLAAttention(RecordsInit, nn.Module):
    def __init__(self, num_heads: int, scale: float, qk_nope_head_dim: int, qk_rope_head_dim: int,
                 v_head_dim: int, kv_lora_rank: int):
        super().__init__()
        self.num_heads, self.scale = num_heads, scale
        self.qk_nope_head_dim, self.qk_rope_head_dim = qk_nope_head_dim, qk_rope_head_dim
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        self.v_head_dim, self.kv_lora_rank = v_head_dim, kv_lora_rank
        self.kv_b_proj = ColumnParallelLinear(kv_lora_rank, num_heads * (qk_nope_head_dim + v_head_dim), bias=False)
        self.kv_cache: Optional[torch.Tensor] = None

    # ---- dispatch -----------------------------------------------------------------------------------
    def forward(self, q: torch.Tensor, kv_c_normed: torch.Tensor, k_pe: torch.Tensor) -> torch.Tensor:
        if on_meta(q, kv_c_normed, k_pe):  # shape only (capture): no store, no per-sequence loop
            return q.new_empty(q.shape[0], self.num_heads * self.v_head_dim)
        meta = get_forward_context()
        if meta is not None and torch.compiler.is_compiling():
            # One opaque op: the metadata's host lengths never become Dynamo guards (one graph
            # serves every step) and the cache store is a declared mutation.
            return mla_attention(q, kv_c_normed, k_pe, self.kv_cache, self.kv_b_proj.weight,
                                 meta.query_start_loc, meta.seq_lens, meta.block_tables, meta.slot_mapping,
                                 self.num_heads, self.scale, self.qk_nope_head_dim, self.qk_rope_head_dim,
                                 self.v_head_dim, self.kv_lora_rank)
        if (triton is not None and q.dtype in _KERNEL_DTYPES and meta is not None
                and use_fast_path(q, kv_c_normed, k_pe)):
            return self.forward_fast(q, kv_c_normed, k_pe)
        return self._forward(q, kv_c_normed, k_pe, native=False)

    def forward_native(self, q, kv_c_normed, k_pe):
        return self._forward(q, kv_c_normed, k_pe, native=True)

    def forward_fast(self, q, kv_c_normed, k_pe):
        """The CUDA path; on CPU tensors only under ``TRITON_INTERPRET=1``. Needs a forward context."""
        return _mla_fast(self, q, kv_c_normed, k_pe, get_forward_context())

    # ---- the definition -------------------------------------------------------------------------------
    def latent_rows(self, kv_c_normed: torch.Tensor, k_pe: torch.Tensor) -> torch.Tensor:
        t = kv_c_normed.shape[0]
        return torch.cat([kv_c_normed.reshape(t, self.kv_lora_rank), k_pe.reshape(t, self.qk_rope_head_dim)], -1)

    def expand(self, latent: torch.Tensor, native: bool):
        """Latent rows [n, R + rope] -> keys [n, H, nope + rope] and values [n, H, v]."""
        n = latent.shape[0]
        kv = run(self.kv_b_proj, native, latent[:, : self.kv_lora_rank])
        kv = kv.view(n, self.num_heads, self.qk_nope_head_dim + self.v_head_dim)
        k_pe = latent[:, None, self.kv_lora_rank:].to(kv.dtype).expand(n, self.num_heads, self.qk_rope_head_dim)
        return torch.cat([kv[..., : self.qk_nope_head_dim], k_pe], -1), kv[..., self.qk_nope_head_dim:]

    def _forward(self, q, kv_c_normed, k_pe, native):
        t = q.shape[0]
        qh = q.reshape(t, self.num_heads, self.qk_head_dim)
        latent = self.latent_rows(kv_c_normed, k_pe)
        meta = get_forward_context()
        if meta is None:  # the whole batch is one causal sequence
            keys, values = self.expand(latent, native)
            return causal_attention(qh, keys, values, 0, self.scale).reshape(t, -1)
        cache = self.kv_cache
        if cache is not None:
            keep = meta.slot_mapping >= 0
            cache.view(-1, cache.shape[-1])[meta.slot_mapping[keep]] = latent[keep].to(cache.dtype)
        out = q.new_empty(t, self.num_heads, self.v_head_dim)
        a = 0
        for i, (q_len, n) in enumerate(zip(meta.query_lens_cpu, meta.seq_lens_cpu)):
            b = a + q_len
            history = self._history(cache, meta, i, n, n - q_len, latent[a:b])
            keys, values = self.expand(history, native)
            out[a:b] = causal_attention(qh[a:b], keys, values, n - q_len, self.scale)
            a = b
        return out.reshape(t, -1)

    @staticmethod
    def _history(cache, meta: AttentionMetadata, i: int, length: int, context: int, own: torch.Tensor):
        """One sequence's latent rows [length, R + rope]: from the paged cache, or (no cache, no
        context) the step's own rows."""
        if cache is not None:
            return gather_kv(cache, meta.block_tables[i], length)
        if context == 0:
            return own
        raise ValueError("a sequence with cached context needs the layer's kv_cache")

    # ---- absorbed weights ---------------------------------------------------------------------------
    def absorbed_weights(self):
        """(W_UK [H, nope, R], W_UV [H, v, R]) as views of ``kv_b_proj.weight``."""
        w = self.kv_b_proj.weight.view(self.num_heads, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank)
        return w[:, : self.qk_nope_head_dim], w[:, self.qk_nope_head_dim:]


# ---- the fast path ----------------------------------------------------------------------------------

def _mla_fast(layer: MLAAttention, q, kv_c_normed, k_pe, meta: AttentionMetadata) -> torch.Tensor:
    from ..ops.mla_decode.decode import store_latent_triton

    t, heads = q.shape[0], layer.num_heads
    qh = q.reshape(t, heads, layer.qk_head_dim)
    out = torch.empty(t, heads, layer.v_head_dim, dtype=q.dtype, device=q.device)
    query_lens, seq_lens = meta.query_lens_cpu, meta.seq_lens_cpu
    if len(query_lens) != meta.num_seqs or sum(query_lens) != t:
        raise ValueError(f"metadata host lengths {query_lens} do not describe {meta.num_seqs} sequences "
                         f"of {t} query tokens")
    cache = layer.kv_cache
    batched_decode = False
    if cache is not None:
        store_latent_triton(kv_c_normed, k_pe, cache, meta.slot_mapping)
        if t == meta.num_seqs and all(n == 1 for n in query_lens):  # pure decode: the CUDA-graph case
            _absorbed_decode(layer, qh, cache, meta.block_tables, meta.seq_lens, out)
            return out.view(t, -1)
        batched_decode = min(query_lens, default=0) >= 1 and 1 in query_lens
        if batched_decode:  # decode rows of a mixed batch: every sequence's last row, others zeroed
            starts = meta.query_start_loc
            last_rows = (starts[1:] - 1).long().clamp_(min=0)
            one_token = (starts[1:] - starts[:-1]) == 1
            lens = torch.where(one_token, meta.seq_lens, torch.zeros_like(meta.seq_lens))
            decoded = torch.empty(meta.num_seqs, heads, layer.v_head_dim, dtype=q.dtype, device=q.device)
            _absorbed_decode(layer, qh.index_select(0, last_rows), cache, meta.block_tables, lens, decoded)
            out.index_copy_(0, last_rows, decoded)
    start = 0
    for i, (q_len, n) in enumerate(zip(query_lens, seq_lens)):
        a, start = start, start + q_len
        if q_len == 0 or (q_len == 1 and batched_decode):
            continue
        context = n - q_len
        if context > 0:
            history = MLAAttention._history(cache, meta, i, n, context, None)
        else:  # no cached context: the step's own rows are the whole history, no gather
            history = (kv_c_normed.reshape(t, -1)[a:start], k_pe.reshape(t, -1)[a:start])
        out[a:start] = _expanded_prefill(layer, qh[a:start], history, context)
    return out.view(t, -1)


def _absorbed_decode(layer: MLAAttention, qh, cache, block_tables, seq_lens, out) -> None:
    """One query row per sequence, in latent space: q_nope · W_UK (one GEMM), the Triton split
    decode and merge, then W_UV (one GEMM). The buffers are laid out [H, B, .] so each GEMM reads
    and writes them as they are: no concatenation of [q_lat | q_pe] (the kernel takes the rope
    part from the query itself) and no transposing copies in between."""
    from ..ops.mla_decode.decode import mla_decode

    b, heads, rank, nope = qh.shape[0], layer.num_heads, layer.kv_lora_rank, layer.qk_nope_head_dim
    w_uk, w_uv = layer.absorbed_weights()
    # [H, B, nope] x [H, nope, R] -> [H, B, R]: each head's query moved into latent space
    q_lat = torch.bmm(qh[..., :nope].transpose(0, 1), w_uk)
    latent_out = torch.empty(heads, b, rank, dtype=qh.dtype, device=qh.device)
    mla_decode(q_lat.transpose(0, 1), cache, block_tables, seq_lens, layer.scale, rank,
               out=latent_out.transpose(0, 1), q_pe=qh[..., nope:])
    # [H, B, R] x [H, R, v] -> [H, B, v], written through out's [H, B, v] view
    torch.bmm(latent_out, w_uv.transpose(1, 2), out=out.transpose(0, 1))


def _bottom_right_mask(length: int, keys: int, device) -> torch.Tensor:
    """[length, keys] bool: query i (at position keys - length + i) sees keys 0..keys - length + i.
    Kept per shape outside graph capture (a tensor made inside a capture is the graph's own)."""
    key = (length, keys, device)
    mask = _MASKS.get(key)
    if mask is None:
        rows = torch.arange(length, device=device)[:, None] + (keys - length)
        mask = torch.arange(keys, device=device)[None, :] <= rows
        capturing = mask.is_cuda and torch.cuda.is_current_stream_capturing()
        if not capturing:
            if len(_MASKS) >= 8:
                _MASKS.pop(next(iter(_MASKS)))
            _MASKS[key] = mask
    return mask


_MASKS: dict = {}


def _expanded_prefill(layer: MLAAttention, q, history, context: int) -> torch.Tensor:
    """Chunk queries [L, H, nope + rope] over their history's latent rows [context + L, R + rope]
    (or (kv_c, k_pe) of the step itself): one kv_b_proj GEMM, the keys' concatenation, SDPA.

    What SDPA sees follows PREFILL (benchmarks/mla.py times the choices): by default V stays 128
    wide (no zero-pad to 192: that is 1.5x the P·V work and an extra copy) and a chunk with cached
    context gets an explicit bottom-right boolean mask, as the sdpa-expanded peer does, so torch may
    pick cuDNN (which takes q/k 192 with v 128 and masks); ``causal_lower_right`` would route it
    to FlashAttention (V padded) or the memory-efficient kernel only."""
    from ..ops.attention.sdpa_prefill import sdpa_causal

    if isinstance(history, tuple):  # the step's own rows: no [kv_c | k_pe] concatenation
        kv_c, k_pe = history
    else:
        kv_c, k_pe = history[:, : layer.kv_lora_rank], history[:, layer.kv_lora_rank:]
    n, heads, nope = kv_c.shape[0], layer.num_heads, layer.qk_nope_head_dim
    kv = run(layer.kv_b_proj, False, kv_c).view(n, heads, nope + layer.v_head_dim)
    keys = torch.cat([kv[..., :nope], k_pe.reshape(n, 1, -1).to(kv.dtype).expand(n, heads, -1)], -1)
    values = kv[..., nope:]
    pad = layer.qk_head_dim - layer.v_head_dim
    if PREFILL.pad_v and pad > 0:
        values = F.pad(values, (0, pad))
    if context == 0 or PREFILL.mask == "lower-right-bias":
        out = sdpa_causal(q, keys, values, context, layer.scale)
    else:
        qh, kh, vh = (x.transpose(0, 1).unsqueeze(0) for x in (q, keys, values))
        mask = _bottom_right_mask(q.shape[0], n, q.device)
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=layer.scale).squeeze(0).transpose(0, 1)
    return out[..., : layer.v_head_dim]


# ---- torch.compile: the layer's work as one custom op --------------------------------------------

@functools.lru_cache(maxsize=None)
def _op_layer(num_heads: int, scale: float, qk_nope_head_dim: int, qk_rope_head_dim: int, v_head_dim: int,
              kv_lora_rank: int) -> MLAAttention:
    """A weightless layer of this shape (built on the meta device, once): the op runs its eager
    ``forward`` with the op's weight and cache bound in, so op and eager module share one code path."""
    with torch.device("meta"):
        return MLAAttention(num_heads, scale, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, kv_lora_rank)


_OP_NAME = op_name("mla_attention", __name__)  # a copy of this file registers its own op


@torch.library.custom_op(_OP_NAME, mutates_args=("kv_cache",))
def mla_attention(q: torch.Tensor, kv_c_normed: torch.Tensor, k_pe: torch.Tensor, kv_cache: Optional[torch.Tensor],
                  kv_b_weight: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                  block_tables: torch.Tensor, slot_mapping: torch.Tensor, num_heads: int, scale: float,
                  qk_nope_head_dim: int, qk_rope_head_dim: int, v_head_dim: int, kv_lora_rank: int) -> torch.Tensor:
    """``MLAAttention.forward`` of one layer and step as an op: store the latent rows, attend."""
    layer = _op_layer(num_heads, scale, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, kv_lora_rank)
    block_size = kv_cache.shape[1] if kv_cache is not None else 1
    meta = _step_metadata(query_start_loc, seq_lens, block_tables, slot_mapping, block_size)
    layer.kv_cache = kv_cache
    try:
        with set_forward_context(meta):
            return torch.func.functional_call(layer, {"kv_b_proj.weight": kv_b_weight}, (q, kv_c_normed, k_pe))
    finally:
        layer.kv_cache = None  # the shared layer never keeps a model's cache alive


@mla_attention.register_fake
def _mla_attention_fake(q, kv_c_normed, k_pe, kv_cache, kv_b_weight, query_start_loc, seq_lens, block_tables,
                        slot_mapping, num_heads, scale, qk_nope_head_dim, qk_rope_head_dim, v_head_dim,
                        kv_lora_rank):
    return q.new_empty(q.shape[0], num_heads * v_head_dim)
