"""Bidirectional attention without a KV cache, as encoders run it: every token attends to every
token of its own sequence (or image), the past and the future alike.

Two production classes, one per batch layout:

* ``EncoderOnlyAttention(num_heads, head_size, scale, num_kv_heads=None)``: vLLM's layer for
  encoder-only text models (BERT, XLM-R / BGE-M3). ``forward(query[T, nq*d], key[T, nk*d],
  value[T, nk*d]) -> [T, nq*d]`` over a *packed* batch: the sequences' boundaries are the
  ``query_start_loc`` (cu_seqlens) of the forward context, read there as the causal ``Attention``
  reads them; there is no cache, so a sequence with cached context is an error. Without metadata
  the whole batch is one sequence.
* ``MultiHeadAttention(num_heads, head_size, scale, num_kv_heads=None)``: vLLM's cache-free layer of
  vision towers (SigLIP, DINOv2 / ViTs). ``forward(query[B, S, nq*d], key[B, Skv, nk*d],
  value[B, Skv, nk*d], attention_mask=None) -> [B, S, nq*d]`` over a *padded* batch (``[B, S,
  heads, d]`` inputs are accepted too). ``attention_mask`` is an extension vLLM's class does not
  have: a bool key-padding mask ``[B, Skv]`` (True = attend), what Hugging Face's BERT feeds SDPA
  for a padded batch of sentences. Each of its rows needs at least one True. A padded query row
  attends to its entry's valid keys like any other row, so it is finite; the suite does not score
  it (pooling discards those rows), so a kernel may write any finite value there, zeros included,
  but must write one (unwritten memory is caught).

``forward_native`` is the semantic definition: scores, softmax and the weighted sum per sequence in
float32 (float64 stays float64: the suite's truth). The fast path on CUDA is the strongest kernel
torch ships: FlashAttention-2's varlen kernel (``aten._flash_attention_forward`` with cu_seqlens,
GQA read directly) for the packed batch, ``F.scaled_dot_product_attention`` (FlashAttention,
cuDNN or memory-efficient, with the mask as a boolean ``[B, 1, 1, Skv]`` attn_mask) for the padded
one; per-sequence SDPA where the varlen kernel does not apply (float32, odd head sizes, older GPUs).

Some shapes have more than one candidate kernel, and the first call of each shape times them and keeps
the fastest (``ops.attention.fastest``; as Triton's autotuner does, outside CUDA-graph capture), each
timed as a CUDA graph of a few calls (GPU time, without the host's launches). Every other kernel
must first give the first one's output (within ``AGREE_L2``), else it is not used:

* a packed batch that is one sequence: SDPA forced to cuDNN (an option that cannot run is
  dropped). On the H200 cuDNN took 580 us on an 8192-token BGE-M3 document where the varlen
  kernel took 880 us (2026-12-05, ``python3 -m
  fk_pytest.peers --device cuda --profile full --ops encoder_only_attention``);
* a padded batch (half types): SDPA forced to cuDNN. On an H100 (2026-12-05, the same
  command with ``--ops multi_head_attention``) cuDNN took 287 us on 32 SigLIP-2 images where
  torch's default pick (FlashAttention) took 423 us, and 37 us on 8 documents padded to 512 tokens
  with their key mask where the default (memory-efficient attention, the mask read as a bias over
  the whole padded square) took 92 us;
* with a key mask also the valid keys of each entry moved to its front (attention does not depend
  on the order of the keys) and FlashAttention's varlen kernel told how many there are
  (``seqused_k``), so padded keys cost nothing; flex_attention, which skips masked blocks, took
  22 us on those 8 documents; and a Triton kernel that sweeps only the span between each entry's
  first and last valid key (kernels_reference/ops/attention/key_mask.py). On an H100 (2026-12-06,
  docs/perf/h100-2026-12-06f.md) the layer then kept that kernel on MiniLM's and BGE-M3's padded
  batches: 23.6 us on the 8 documents (flex_attention 22.5, cuDNN 37.4) and 18.2 us on 32 BGE-M3
  queries of 128 tokens (cuDNN 26.8). While the options were timed as back-to-back eager calls
  (until that day) the choice measured the host's launches, and cuDNN was kept at 37 us.
On the CPU ``forward`` runs ``forward_native``. Under ``torch.compile`` the packed layer is one
opaque op, ``fk::encoder_only_attention``, whose implementation picks the path when it runs (its
per-sequence lengths are host values); the padded layer's SDPA is traced as it is.
"""
import contextlib
from typing import Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ..dispatch import compute_dtype, op_name, use_fast_path
from ..ops.attention.fastest import fastest
from ..ops.attention.key_mask import key_mask_attention
from ..forward_context import get_forward_context
from ..records import RecordsInit

_FLASH_DTYPES = (torch.float16, torch.bfloat16)
_KEY_MASK_MAX_HEAD = 128  # head sizes the key-span kernel takes (its tiles hold a whole head)
# Scores held at once by the native path ([heads, query rows, keys]); longer sequences go by
# blocks of query rows (softmax is per row, so the result is the same): an 8192-token document's
# float64 truth stays a few hundred MB instead of 8.6 GB of scores.
_NATIVE_SCORES_PER_BLOCK = 1 << 25


def split_heads(x: torch.Tensor, heads: int, head_size: int, leading: int = 1) -> torch.Tensor:
    """``x`` with ``leading`` token dimensions ([T] packed, [B, S] padded), then heads * d features
    (views of fused qkv columns stay views) or heads and d already apart, as [..., heads, d]."""
    return x.reshape(*x.shape[:leading], heads, head_size)


# ---- the semantic definition ----------------------------------------------------------------------

def bidirectional_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                            key_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """One sequence: q [Lq, nq, d] attends to every key of k/v [Lk, nk, d] (``key_mask`` [Lk] bool:
    False keys take no part); nq a multiple of nk (GQA). Returns [Lq, nq, d] in q's dtype."""
    compute = compute_dtype(q.dtype)
    group = q.shape[1] // k.shape[1]
    kc = k.to(compute).repeat_interleave(group, dim=1)
    vc = v.to(compute).repeat_interleave(group, dim=1)
    rows = max(1, _NATIVE_SCORES_PER_BLOCK // max(1, q.shape[1] * k.shape[0]))
    blocks = []
    for first in range(0, q.shape[0], rows):
        scores = torch.einsum("qhd,khd->hqk", q[first:first + rows].to(compute), kc) * scale
        if key_mask is not None:
            scores = scores.masked_fill(~key_mask, float("-inf"))
        blocks.append(torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), vc).to(q.dtype))
    return torch.cat(blocks) if blocks else q.new_empty(q.shape)


def varlen_attention_native(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, query_lens: Sequence[int],
                            scale: float) -> torch.Tensor:
    """Packed [T, heads, d] rows: each sequence (``query_lens``, in order) attends within itself."""
    blocks, first = [], 0
    for n in query_lens:
        if n:
            blocks.append(bidirectional_attention(q[first:first + n], k[first:first + n], v[first:first + n], scale))
        first += n
    return torch.cat(blocks) if blocks else q.new_empty(q.shape)


def padded_attention_native(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                            key_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """[B, S, nq, d] queries over [B, Skv, nk, d] keys/values, entry by entry; ``key_mask`` [B, Skv]."""
    rows = [bidirectional_attention(q[b], k[b], v[b], scale, None if key_mask is None else key_mask[b])
            for b in range(q.shape[0])]
    return torch.stack(rows) if rows else q.new_empty(q.shape)


# ---- the fast path (CUDA) -------------------------------------------------------------------------

def _flash_varlen_applies(q: torch.Tensor, k: torch.Tensor) -> bool:
    """FlashAttention-2 as torch builds it: half types, head sizes a multiple of 8 up to 256,
    Ampere or newer; K/V heads dividing the query heads (it reads shared heads itself)."""
    d = q.shape[-1]
    return (q.dtype in _FLASH_DTYPES and d % 8 == 0 and d <= 256 and q.shape[1] % k.shape[1] == 0
            and hasattr(torch.ops.aten, "_flash_attention_forward")
            and torch.backends.cuda.is_flash_attention_available()
            and torch.cuda.get_device_capability(q.device) >= (8, 0))


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
          key_mask: Optional[torch.Tensor] = None, only_cudnn: bool = False) -> torch.Tensor:
    """[B, L, heads, d] through SDPA ([B, heads, L, d] views, no copy), no causal mask; with
    ``only_cudnn`` cuDNN's kernel or a RuntimeError, never a silent fallback. The option used to
    prefer cuDNN with torch's other kernels behind it, and on MiniLM's padded B8 S512 batch (H100,
    2026-12-05) the layer then timed like the memory-efficient kernel (91.8 us against 92.0) where
    SDPA allowed cuDNN alone took 37.5 us: a preference torch may serve with another kernel, which
    is then timed twice."""
    qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))
    mask = None if key_mask is None else key_mask[:, None, None, :]
    scope = contextlib.nullcontext()
    if only_cudnn:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        scope = sdpa_kernel([SDPBackend.CUDNN_ATTENTION])
    with scope:
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale,
                                             enable_gqa=k.shape[2] != q.shape[2])
    return out.transpose(1, 2)


def _shape_key(q: torch.Tensor, k: torch.Tensor) -> tuple:
    return tuple(q.shape) + tuple(k.shape) + (q.dtype, q.device.index)


# ---- the padded batch with a key mask: valid keys first, FlashAttention told how many -------------

def valid_keys_first(key_mask: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """For ``key_mask`` [B, Skv] (True = attend): the key each new place takes ([B, Skv] int64, a
    permutation per entry: the valid keys first in their order, then the padded ones), and the count
    of valid keys per entry ([B] int32). One stable sort of a row of flags, on the device: no host sync."""
    order = torch.argsort((~key_mask).to(torch.uint8), dim=-1, stable=True)
    return order, key_mask.sum(dim=-1, dtype=torch.int32)


def compact_keys(x: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """x [B, Skv, heads, d] with each entry's rows in ``order`` (valid_keys_first), by one gather.
    Until 2026-12-05 the rows went by an indexed write, and the whole option took 3.8x the time of
    SDPA with the mask on 8 MiniLM documents of 512 tokens on the H100 (docs/perf/h100-2026-12-05.md,
    benchmarks/encoder_choices); where that time went was not measured."""
    return torch.gather(x, 1, order[:, :, None, None].expand(-1, -1, x.shape[2], x.shape[3]))


def masked_flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                           key_mask: torch.Tensor) -> torch.Tensor:
    """[B, S, nq, d] over [B, Skv, nk, d] with a key mask, as one FlashAttention-2 varlen launch over
    the entries laid end to end, each entry's valid keys first and ``seqused_k`` their count."""
    b, s, nq, d = q.shape
    skv = k.shape[1]
    order, counts = valid_keys_first(key_mask)
    kc, vc = compact_keys(k, order), compact_keys(v, order)
    steps = torch.arange(b + 1, device=q.device, dtype=torch.int32)
    out = torch.ops.aten._flash_attention_forward(
        q.reshape(b * s, nq, d), kc.view(b * skv, -1, d), vc.view(b * skv, -1, d), steps * s, steps * skv, s, skv,
        0.0, False, False, scale=scale, seqused_k=counts)[0]
    return out.view(b, s, nq, d)


def varlen_attention_fast(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                          query_lens: Sequence[int], scale: float) -> torch.Tensor:
    """The packed batch in one FlashAttention-2 varlen launch (keys = queries, cu_seqlens shared);
    per-sequence SDPA where that kernel does not apply."""
    if q.shape[0] == 0:
        return q.new_empty(q.shape)
    if _flash_varlen_applies(q, k):
        cu = cu_seqlens.to(device=q.device, dtype=torch.int32).contiguous()
        longest = max(query_lens)

        def varlen():
            return torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, longest, longest, 0.0, False, False,
                                                           scale=scale)[0]

        if len(query_lens) > 1:
            return varlen()
        return fastest(("one-sequence",) + _shape_key(q, k),
                        {"flash-varlen": varlen,
                         "sdpa-cudnn": lambda: _sdpa(q[None], k[None], v[None], scale, only_cudnn=True)[0]})
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    first = 0
    for n in query_lens:
        if n:
            rows = slice(first, first + n)
            out[rows] = _sdpa(q[None, rows], k[None, rows], v[None, rows], scale)[0]
        first += n
    return out


# ---- the packed layer ------------------------------------------------------------------------------

def packed_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seqlens: torch.Tensor,
                     query_lens: Sequence[int], num_heads: int, num_kv_heads: int, head_size: int, scale: float,
                     fast: bool) -> torch.Tensor:
    """[T, heads * d] packed rows, the sequences given by ``cu_seqlens`` and their host copy
    ``query_lens``, through the fast path or the native one; returns [T, nq * d]."""
    if sum(query_lens) != query.shape[0]:
        raise ValueError(f"the metadata describes {sum(query_lens)} tokens, the batch has {query.shape[0]}")
    q = split_heads(query, num_heads, head_size)
    k = split_heads(key, num_kv_heads, head_size)
    v = split_heads(value, num_kv_heads, head_size)
    if fast:
        out = varlen_attention_fast(q, k, v, cu_seqlens, query_lens, scale)
    else:
        out = varlen_attention_native(q, k, v, query_lens, scale)
    return out.reshape(query.shape[0], num_heads * head_size)


def _host_query_lens(cu_seqlens: torch.Tensor) -> Tuple[int, ...]:
    """Each sequence's length on the host: the forward context's copy when it describes these very
    cu_seqlens (no device sync; a compiled graph may hand over an alias, so memory is compared), else
    read from the device."""
    meta = get_forward_context()
    if meta is not None and meta.query_lens_cpu:
        mine = meta.query_start_loc
        if mine is cu_seqlens or (mine.device == cu_seqlens.device and mine.data_ptr() == cu_seqlens.data_ptr()
                                  and mine.shape == cu_seqlens.shape):
            return _sequence_lens(meta)
    return tuple(cu_seqlens.diff().tolist())


# A copy of this file imported under another name (a candidate tree that copies the reference)
# registers its own op instead of colliding with this one.
_OP_NAME = op_name("encoder_only_attention", __name__)


@torch.library.custom_op(_OP_NAME, mutates_args=())
def encoder_only_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seqlens: torch.Tensor,
                           num_heads: int, num_kv_heads: int, head_size: int, scale: float) -> torch.Tensor:
    """``EncoderOnlyAttention.forward`` with its metadata as an op: the per-sequence lengths stay
    host values inside it instead of becoming Dynamo guards (a recompile per batch)."""
    return packed_attention(query, key, value, cu_seqlens, _host_query_lens(cu_seqlens), num_heads, num_kv_heads,
                            head_size, scale, fast=use_fast_path(query, key, value))


@encoder_only_attention.register_fake
def _encoder_only_attention_fake(query, key, value, cu_seqlens, num_heads, num_kv_heads, head_size, scale):
    return query.new_empty(query.shape[0], num_heads * head_size)


class EncoderOnlyAttention(RecordsInit, nn.Module):
    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: Optional[int] = None):
        super().__init__()
        self.num_heads, self.head_size, self.scale = num_heads, head_size, scale
        self.num_kv_heads = num_kv_heads or num_heads

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        meta = get_forward_context()
        if meta is not None and torch.compiler.is_compiling():
            # Only the metadata's tensor enters the graph: its host lengths would become guards.
            return encoder_only_attention(query, key, value, meta.query_start_loc, self.num_heads,
                                          self.num_kv_heads, self.head_size, self.scale)
        return self._attend(query, key, value, fast=use_fast_path(query, key, value))

    def forward_fast(self, query, key, value):
        """The CUDA path (FlashAttention-2 varlen, or SDPA per sequence)."""
        return self._attend(query, key, value, fast=True)

    def forward_native(self, query, key, value):
        return self._attend(query, key, value, fast=False)

    def _attend(self, query, key, value, fast: bool):
        """The packed batch's sequences from the forward context; without one, a single sequence."""
        meta = get_forward_context()
        if meta is None:
            t = query.shape[0]
            cu, lens = torch.tensor([0, t], dtype=torch.int32, device=query.device), (t,)
        else:
            cu, lens = meta.query_start_loc, _sequence_lens(meta)
        return packed_attention(query, key, value, cu, lens, self.num_heads, self.num_kv_heads, self.head_size,
                                self.scale, fast)

    def extra_repr(self) -> str:
        return (f"num_heads={self.num_heads}, head_size={self.head_size}, scale={self.scale}, "
                f"num_kv_heads={self.num_kv_heads}")


def _sequence_lens(meta) -> Tuple[int, ...]:
    """The step's sequence lengths on the host; refused when a sequence has cached context (there
    is no cache to hold it)."""
    lens = tuple(meta.query_lens_cpu) or tuple(meta.query_start_loc.diff().tolist())
    seq_lens = tuple(meta.seq_lens_cpu)
    if seq_lens and seq_lens != lens:
        raise ValueError("encoder-only attention has no KV cache: every sequence must be new this step "
                         f"(query lens {lens}, sequence lens {seq_lens})")
    return lens


# ---- the padded layer -----------------------------------------------------------------------------

class MultiHeadAttention(RecordsInit, nn.Module):
    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: Optional[int] = None):
        super().__init__()
        self.num_heads, self.head_size, self.scale = num_heads, head_size, scale
        self.num_kv_heads = num_kv_heads or num_heads

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        # SDPA is an op Dynamo traces as it is, so CUDA keeps it under torch.compile too (vLLM's
        # layer is no CustomOp either); the CPU runs the definition.
        if query.is_cuda:
            return self.forward_fast(query, key, value, attention_mask)
        return self.forward_native(query, key, value, attention_mask)

    def forward_fast(self, query, key, value, attention_mask=None):
        """The CUDA path: one SDPA call over the batch; with a key mask, that, FlashAttention over
        the valid keys or the Triton kernel over each entry's span of valid keys, whichever is
        faster for the shape."""
        q, k, v = self._heads(query, key, value)
        if torch.compiler.is_compiling() or q.dtype not in _FLASH_DTYPES:
            out = _sdpa(q, k, v, self.scale, attention_mask)
        elif attention_mask is None:
            out = fastest(("padded",) + _shape_key(q, k),
                           {"sdpa": lambda: _sdpa(q, k, v, self.scale),
                            "sdpa-cudnn": lambda: _sdpa(q, k, v, self.scale, only_cudnn=True)})
        else:
            options = {"sdpa-mask": lambda: _sdpa(q, k, v, self.scale, attention_mask),
                       "sdpa-cudnn-mask": lambda: _sdpa(q, k, v, self.scale, attention_mask, only_cudnn=True)}
            if _flash_varlen_applies(q[0], k[0]):
                options["flash-valid-keys"] = lambda: masked_flash_attention(q, k, v, self.scale, attention_mask)
            if q.shape[-1] <= _KEY_MASK_MAX_HEAD:
                options["triton-key-span"] = lambda: key_mask_attention(q, k, v, self.scale, attention_mask)
            out = fastest(("padded-masked",) + _shape_key(q, k), options)
        return out.reshape(*query.shape[:2], -1)

    def forward_native(self, query, key, value, attention_mask=None):
        q, k, v = self._heads(query, key, value)
        return padded_attention_native(q, k, v, self.scale, attention_mask).reshape(*query.shape[:2], -1)

    def _heads(self, query, key, value):
        return (split_heads(query, self.num_heads, self.head_size, leading=2),
                split_heads(key, self.num_kv_heads, self.head_size, leading=2),
                split_heads(value, self.num_kv_heads, self.head_size, leading=2))

    def extra_repr(self) -> str:
        return (f"num_heads={self.num_heads}, head_size={self.head_size}, scale={self.scale}, "
                f"num_kv_heads={self.num_kv_heads}")
