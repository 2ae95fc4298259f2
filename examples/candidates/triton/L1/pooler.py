import torch
import triton
import triton.language as tl
from torch import nn

_MODES = {"MEAN": 0, "CLS": 1, "LAST": 2}


@triton.jit
def _pool_one_sequence(h_ptr, lens_ptr, out_ptr, n_seqs, width, h_stride, eps,
                       MODE: tl.constexpr, NORMALIZE: tl.constexpr, COLS: tl.constexpr,
                       TOKENS: tl.constexpr, SEQ_CHUNK: tl.constexpr):
    # One program per sequence holding its whole row, so the L2 norm needs no second pass.
    seq = tl.program_id(0)
    # Where the sequence starts: the lengths before it, summed here (no offsets tensor needed).
    before = tl.zeros([SEQ_CHUNK], dtype=tl.int64)
    for s0 in range(0, n_seqs, SEQ_CHUNK):
        s = s0 + tl.arange(0, SEQ_CHUNK)
        before += tl.load(lens_ptr + s, mask=s < seq, other=0).to(tl.int64)
    start = tl.sum(before, axis=0)
    length = tl.load(lens_ptr + seq).to(tl.int32)
    cols = tl.arange(0, COLS)
    col_ok = cols < width
    if MODE == 0:
        total = tl.zeros([COLS], dtype=tl.float32)
        for t0 in range(0, length, TOKENS):
            t = t0 + tl.arange(0, TOKENS)
            ok = (t < length)[:, None] & col_ok[None, :]
            tile = tl.load(h_ptr + (start + t)[:, None] * h_stride + cols[None, :], mask=ok, other=0.0)
            total += tl.sum(tile.to(tl.float32), axis=0)
        vec = total / length.to(tl.float32)
    elif MODE == 1:
        vec = tl.load(h_ptr + start * h_stride + cols, mask=col_ok, other=0.0).to(tl.float32)
    else:
        row = start + length - 1
        vec = tl.load(h_ptr + row * h_stride + cols, mask=col_ok, other=0.0).to(tl.float32)
    if NORMALIZE:
        vec = vec / tl.maximum(tl.sqrt(tl.sum(vec * vec, axis=0)), eps)
    tl.store(out_ptr + seq.to(tl.int64) * width + cols, vec, mask=col_ok)


class Pooler(nn.Module):
    def __init__(self, pooling_type: str = "MEAN", normalize: bool = True):
        super().__init__()
        self.pooling_type = pooling_type
        self.normalize = normalize

    def forward(self, hidden_states, prompt_lens):
        h = hidden_states if hidden_states.stride(-1) == 1 else hidden_states.contiguous()
        n_seqs, width = prompt_lens.shape[0], h.shape[-1]
        out_dtype = torch.promote_types(h.dtype, torch.float32)  # embeddings are float32
        out = torch.empty((n_seqs, width), dtype=torch.float32, device=h.device)
        if n_seqs:
            cols = triton.next_power_of_2(width)
            tokens = max(1, (8192 if h.is_cuda else 1 << 16) // cols)  # the interpreter: big tiles
            _pool_one_sequence[(n_seqs,)](h, prompt_lens, out, n_seqs, width, h.stride(0), 1e-12,
                                          MODE=_MODES[self.pooling_type], NORMALIZE=self.normalize, COLS=cols,
                                          TOKENS=tokens, SEQ_CHUNK=256, num_warps=4)
        return out.to(out_dtype)
