"""Pooler: one embedding per sequence from an encoder's packed hidden states, as vLLM's pooling
runner makes it for ``embed`` requests (its ``SequencePooler``: a pooling method, then the
embedding head's L2 normalisation).

``forward(hidden_states [T, H], prompt_lens [B]) -> [B, H]``: the batch is packed, sequence ``b``
owning the ``prompt_lens[b]`` rows after those of sequences ``0..b-1`` (the lengths sum to ``T``,
each at least 1). ``pooling_type``:

* ``"MEAN"``: the average of the sequence's rows (sentence-transformers' mean pooling, e.g.
  all-MiniLM-L6-v2), accumulated in float32 as vLLM's ``MeanPool`` does;
* ``"CLS"``: the sequence's first row (BERT / XLM-R's [CLS], e.g. BGE-M3);
* ``"LAST"``: its last row (decoder embedding models, e.g. Qwen3-Embedding).

With ``normalize`` (the embed task's default) the pooled vector is divided by its L2 norm, or by
1e-12 when smaller (``F.normalize``'s eps). vLLM runs pooling heads in float32 (``head_dtype``
defaults to float32 for pooling models), so embeddings come out float32 whatever the model's
dtype: the output dtype is float32 (float64 for float64 hidden states, the truth's case).
"""
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..dispatch import use_fast_path
from ..records import RecordsInit
from ..triton_rows import sm_count

try:
    import triton
    import triton.language as tl
except ImportError:  # the native path still works without Triton
    triton = None

POOLING_TYPES = ("MEAN", "CLS", "LAST")
NORM_EPS = 1e-12  # F.normalize's default, which vLLM's PoolerNormalize uses
_MODE = {"MEAN": 0, "CLS": 1, "LAST": 2}


def embedding_dtype(hidden_dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(hidden_dtype, torch.float32)


class Pooler(RecordsInit, nn.Module):
    def __init__(self, pooling_type: str = "MEAN", normalize: bool = True):
        super().__init__()
        if pooling_type not in POOLING_TYPES:
            raise ValueError(f"pooling_type must be one of {POOLING_TYPES}, got {pooling_type!r}")
        self.pooling_type = pooling_type
        self.normalize = normalize

    def forward(self, hidden_states: torch.Tensor, prompt_lens: torch.Tensor) -> torch.Tensor:
        if triton is not None and use_fast_path(hidden_states, prompt_lens):
            return self.forward_triton(hidden_states, prompt_lens)
        return self.forward_native(hidden_states, prompt_lens)

    def forward_native(self, hidden_states, prompt_lens):
        dtype = embedding_dtype(hidden_states.dtype)
        lens = prompt_lens.to(device=hidden_states.device, dtype=torch.long)
        ends = torch.cumsum(lens, dim=0)
        if self.pooling_type == "MEAN":
            # Each row's sequence from a search in the end offsets: every shape is static (no
            # split by host-side lengths), so this traces into one graph under torch.compile.
            rows = torch.arange(hidden_states.shape[0], device=hidden_states.device)
            owner = torch.searchsorted(ends, rows, right=True)
            sums = torch.zeros((lens.shape[0], hidden_states.shape[-1]), dtype=dtype, device=hidden_states.device)
            sums.index_add_(0, owner, hidden_states.to(dtype))
            pooled = sums / lens.unsqueeze(1).to(dtype)
        elif self.pooling_type == "CLS":
            pooled = hidden_states[ends - lens].to(dtype)
        else:
            pooled = hidden_states[ends - 1].to(dtype)
        if self.normalize:
            pooled = F.normalize(pooled, p=2.0, dim=-1, eps=NORM_EPS)
        return pooled

    def forward_triton(self, hidden_states, prompt_lens):
        return pool_sequences(hidden_states, prompt_lens, self.pooling_type, self.normalize)

    def extra_repr(self) -> str:
        return f"pooling_type={self.pooling_type!r}, normalize={self.normalize}"


class PoolTiles(NamedTuple):
    """One launch configuration: columns and tokens of a program's tile, and how many programs
    share each sequence's tokens (1: no split, the pooled row is finished in place)."""
    block: int
    tokens: int
    splits: int


# A mean over few long sequences splits each sequence's tokens over several programs: 8 passages
# of 512 tokens at width 384 are 24 (sequence, 128-column) programs on 132 SMs, each walking 512
# tokens (26.1 us against torch.compile's 17.4 on the H200, 2026-12-05, ``python3 -m
# fk_pytest.peers --device cuda --profile full --ops pooler``). The split applies below
# SPLIT_BELOW_PROGRAMS_PER_SM programs an SM and from SPLIT_FROM_TOKENS tokens a sequence on average
# (the host knows the total, not the lengths, without a sync), about TOKENS_PER_SPLIT tokens a
# program, up to SPLIT_PROGRAMS_PER_SM programs an SM.
SPLIT_BELOW_PROGRAMS_PER_SM = 2
SPLIT_FROM_TOKENS = 256
TOKENS_PER_SPLIT = 64
SPLIT_PROGRAMS_PER_SM = 4


def pool_sequences(hidden_states: torch.Tensor, prompt_lens: torch.Tensor, pooling_type: str,
                   normalize: bool, config: Optional[PoolTiles] = None) -> torch.Tensor:
    """The fast path: a program per (sequence, column block) pools into a float32 ``[B, H]``; the
    normalisation runs in the same program when it holds whole rows, else as a second pass. A
    split mean writes float32 partial sums ``[B, splits, H]`` instead, and a finishing program per
    sequence adds them up, divides and normalises. ``config`` is only given by tests that run the
    GPU's tiling in the interpreter."""
    if hidden_states.dim() != 2:
        raise ValueError(f"Pooler expects packed hidden states [T, H], got {tuple(hidden_states.shape)}")
    h = hidden_states if hidden_states.stride(-1) == 1 else hidden_states.contiguous()
    n_seqs, width = prompt_lens.shape[0], h.shape[1]
    out = torch.empty((n_seqs, width), dtype=embedding_dtype(h.dtype), device=h.device)
    if n_seqs == 0 or width == 0:
        return out
    # The lengths as given (int32 or int64): each program sums the ones before its own sequence,
    # so no cast or prefix-sum launch comes first. Those took a CLS gather from 2 to 6 us on the
    # H200 (2026-12-05), three launches for a few hundred bytes.
    lens = prompt_lens if prompt_lens.device == h.device else prompt_lens.to(h.device)
    lens = lens.contiguous()
    block, tokens, splits = config or launch_config(h, n_seqs, pooling_type)
    prefix = min(1024, triton.next_power_of_2(n_seqs))
    warps = 4 if block * tokens >= 2048 else 2
    whole_row = triton.next_power_of_2(width)
    if pooling_type == "MEAN" and splits > 1:
        partial = torch.empty((n_seqs, splits, width), dtype=torch.float32, device=h.device)
        _mean_partial_kernel[(n_seqs, triton.cdiv(width, block), splits)](
            h, lens, partial, width, h.stride(0), splits, BLOCK=block, TOKENS=tokens, PREFIX=prefix, num_warps=warps)
        _mean_finish_kernel[(n_seqs,)](partial, lens, out, width, splits, NORM_EPS, NORMALIZE=normalize,
                                       BLOCK=whole_row, num_warps=4 if whole_row >= 1024 else 2)
        return out
    fused_norm = normalize and block >= width
    grid = (n_seqs, triton.cdiv(width, block))
    _pool_kernel[grid](h, lens, out, width, h.stride(0), NORM_EPS,
                       MODE=_MODE[pooling_type], NORMALIZE=fused_norm, BLOCK=block, TOKENS=tokens,
                       PREFIX=prefix, num_warps=warps)
    if normalize and not fused_norm:
        _normalize_rows_kernel[(n_seqs,)](out, width, NORM_EPS, BLOCK=whole_row, num_warps=4)
    return out


def launch_config(h: torch.Tensor, n_seqs: int, pooling_type: str) -> PoolTiles:
    """Whole rows per program are what the interpreter wants (it pays per program) and what a
    gather (CLS / LAST) or a big batch needs; a mean over few sequences takes 128-column blocks
    (the 32 sentences of a batch are 96 programs at width 384), and splits the tokens as well when
    even those are too few programs for sequences this long."""
    whole_row = triton.next_power_of_2(h.shape[1])
    if not h.is_cuda:  # the interpreter: whole rows, the tokens of a sequence in a few tiles
        return PoolTiles(whole_row, max(1, min(256, (1 << 16) // whole_row)), 1)
    if pooling_type != "MEAN" or n_seqs >= 128:
        return PoolTiles(whole_row, max(1, min(16, 4096 // whole_row)), 1)
    block = min(whole_row, 128)
    programs, sms = n_seqs * triton.cdiv(h.shape[1], block), sm_count(h.device)
    mean_tokens = h.shape[0] // n_seqs
    if programs >= SPLIT_BELOW_PROGRAMS_PER_SM * sms or mean_tokens < SPLIT_FROM_TOKENS:
        return PoolTiles(block, 32, 1)
    splits = min(triton.cdiv(mean_tokens, TOKENS_PER_SPLIT), triton.cdiv(SPLIT_PROGRAMS_PER_SM * sms, programs))
    return PoolTiles(block, 32, max(1, splits))


if triton is not None:

    @triton.jit
    def _sequence_start(lens_ptr, seq, PREFIX: tl.constexpr):
        """The first row of sequence ``seq``: the lengths of those before it, summed in int64 so
        that row offsets of long packed batches fit."""
        start = tl.zeros([], dtype=tl.int64)
        for first in range(0, seq, PREFIX):
            earlier = first + tl.arange(0, PREFIX)
            start += tl.sum(tl.load(lens_ptr + earlier, mask=earlier < seq, other=0).to(tl.int64), axis=0)
        return start

    @triton.jit
    def _pool_kernel(h_ptr, lens_ptr, out_ptr, width, h_row_stride, eps,
                     MODE: tl.constexpr, NORMALIZE: tl.constexpr, BLOCK: tl.constexpr, TOKENS: tl.constexpr,
                     PREFIX: tl.constexpr):
        seq = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        col_ok = cols < width
        start = _sequence_start(lens_ptr, seq, PREFIX)
        length = tl.load(lens_ptr + seq).to(tl.int32)  # the loop bound in the type of its counter
        if MODE == 0:
            # Token tiles summed in float32 registers, reduced once at the end.
            acc = tl.zeros([TOKENS, BLOCK], dtype=tl.float32)
            for t0 in range(0, length, TOKENS):
                t = t0 + tl.arange(0, TOKENS)
                ok = (t < length)[:, None] & col_ok[None, :]
                ptrs = h_ptr + (start + t)[:, None] * h_row_stride + cols[None, :]
                acc += tl.load(ptrs, mask=ok, other=0.0).to(tl.float32)
            pooled = tl.sum(acc, axis=0) / length.to(tl.float32)
        else:
            if MODE == 1:
                row = start
            else:
                row = start + length - 1
            pooled = tl.load(h_ptr + row * h_row_stride + cols, mask=col_ok, other=0.0).to(tl.float32)
        if NORMALIZE:
            norm = tl.sqrt(tl.sum(pooled * pooled, axis=0))
            pooled = pooled / tl.maximum(norm, eps)
        tl.store(out_ptr + seq * width + cols, pooled.to(out_ptr.dtype.element_ty), mask=col_ok)

    @triton.jit
    def _mean_partial_kernel(h_ptr, lens_ptr, partial_ptr, width, h_row_stride, splits,
                             BLOCK: tl.constexpr, TOKENS: tl.constexpr, PREFIX: tl.constexpr):
        # Each sequence's own length divided over the splits in whole token tiles (the host does not
        # know the lengths): a split past a short sequence's end sums nothing and stores zeros.
        seq = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        split = tl.program_id(2)
        col_ok = cols < width
        start = _sequence_start(lens_ptr, seq, PREFIX)
        length = tl.load(lens_ptr + seq).to(tl.int32)
        chunk = tl.cdiv(tl.cdiv(length, splits), TOKENS) * TOKENS
        first = split * chunk
        last = tl.minimum(first + chunk, length)
        acc = tl.zeros([TOKENS, BLOCK], dtype=tl.float32)
        for t0 in range(first, last, TOKENS):
            t = t0 + tl.arange(0, TOKENS)
            ok = (t < last)[:, None] & col_ok[None, :]
            ptrs = h_ptr + (start + t)[:, None] * h_row_stride + cols[None, :]
            acc += tl.load(ptrs, mask=ok, other=0.0).to(tl.float32)
        tl.store(partial_ptr + (seq * splits + split) * width + cols, tl.sum(acc, axis=0), mask=col_ok)

    @triton.jit
    def _mean_finish_kernel(partial_ptr, lens_ptr, out_ptr, width, splits, eps,
                            NORMALIZE: tl.constexpr, BLOCK: tl.constexpr):
        seq = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        ok = cols < width
        row = partial_ptr + seq * splits * width + cols
        total = tl.zeros([BLOCK], dtype=tl.float32)
        for split in range(0, splits):  # in split order: the same bits every run
            total += tl.load(row + split * width, mask=ok, other=0.0)
        pooled = total / tl.load(lens_ptr + seq).to(tl.float32)
        if NORMALIZE:
            norm = tl.sqrt(tl.sum(pooled * pooled, axis=0))
            pooled = pooled / tl.maximum(norm, eps)
        tl.store(out_ptr + seq * width + cols, pooled.to(out_ptr.dtype.element_ty), mask=ok)

    @triton.jit
    def _normalize_rows_kernel(out_ptr, width, eps, BLOCK: tl.constexpr):
        seq = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        ok = cols < width
        v = tl.load(out_ptr + seq * width + cols, mask=ok, other=0.0).to(tl.float32)
        norm = tl.sqrt(tl.sum(v * v, axis=0))
        tl.store(out_ptr + seq * width + cols, (v / tl.maximum(norm, eps)).to(out_ptr.dtype.element_ty), mask=ok)
