"""Token embedding as a Triton row gather; the LM head as a plain PyTorch GEMM.

Under tensor parallelism (the serving framework's parallel state, read when built) the vocabulary
is padded to a multiple of 64 and split into equal row ranges: the gather looks up the ids inside
this rank's range (the kernel's zero rows for the rest) and the rows are all-reduced; the head
computes its range's logits, all-gathers them and cuts the padding off."""
import torch
import triton
import triton.language as tl
from torch import nn

from kernels_reference.parallel_state import (get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size,
                                              tensor_model_parallel_all_gather, tensor_model_parallel_all_reduce)

PADDING = 64


def _rows_here(num_embeddings):
    """(rows this rank holds, the first id among them)."""
    tp, rank = get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
    if tp == 1:
        return num_embeddings, 0
    rows = -(-num_embeddings // PADDING) * PADDING // tp
    return rows, rank * rows


@triton.jit
def _gather_rows(ids_ptr, table_ptr, out_ptr, n_tokens, vocab, width, table_stride,
                 TOKENS: tl.constexpr, COLS: tl.constexpr):
    # A [TOKENS, COLS] tile of output rows. Ids outside the table give zero rows (the masked
    # lookup of a vocabulary shard) instead of an out-of-bounds read.
    tok = tl.program_id(0) * TOKENS + tl.arange(0, TOKENS)
    col = tl.program_id(1) * COLS + tl.arange(0, COLS)
    tok_ok = tok < n_tokens
    idx = tl.load(ids_ptr + tok, mask=tok_ok, other=-1).to(tl.int64)
    hit = (idx >= 0) & (idx < vocab)
    idx = tl.where(hit, idx, 0)
    col_ok = (col < width)[None, :]
    row = tl.load(table_ptr + idx[:, None] * table_stride + col[None, :], mask=hit[:, None] & col_ok, other=0.0)
    tl.store(out_ptr + tok.to(tl.int64)[:, None] * width + col[None, :], row, mask=tok_ok[:, None] & col_ok)


class VocabParallelEmbedding(nn.Module):
    def __init__(self, num_embeddings, embedding_dim):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.tp = get_tensor_model_parallel_world_size()
        self.rows, self.first = _rows_here(num_embeddings)
        self.weight = nn.Parameter(torch.empty(self.rows, embedding_dim))

    def forward(self, input_ids):
        out = self._gather(input_ids - self.first if self.first else input_ids)
        return tensor_model_parallel_all_reduce(out) if self.tp > 1 else out

    def _gather(self, input_ids):
        table = self.weight if self.weight.stride(-1) == 1 else self.weight.contiguous()
        ids = input_ids.reshape(-1)
        width = self.embedding_dim
        out = torch.empty((*input_ids.shape, width), dtype=table.dtype, device=table.device)
        n = ids.numel()
        if n and width:
            cols = min(triton.next_power_of_2(width), 1024 if table.is_cuda else 4096)
            # The interpreter pays per program: bigger tiles there; a GPU wants ~4K elements each.
            tokens = max(1, min((4096 if table.is_cuda else 1 << 16) // cols, triton.next_power_of_2(n)))
            grid = (triton.cdiv(n, tokens), triton.cdiv(width, cols))
            _gather_rows[grid](ids, table, out, n, self.rows, width, table.stride(0),
                               TOKENS=tokens, COLS=cols, num_warps=4)
        return out


class ParallelLMHead(nn.Module):
    """Logits = hidden @ weight.T (+ bias): a GEMM, left to the BLAS."""

    def __init__(self, num_embeddings, embedding_dim, bias=False):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.tp = get_tensor_model_parallel_world_size()
        self.rows, _ = _rows_here(num_embeddings)
        self.weight = nn.Parameter(torch.empty(self.rows, embedding_dim))
        self.bias = nn.Parameter(torch.empty(self.rows)) if bias else None

    def forward(self, hidden_states):
        rows = hidden_states.reshape(-1, hidden_states.shape[-1])
        logits = torch.mm(rows, self.weight.t()) if self.bias is None else \
            torch.addmm(self.bias, rows, self.weight.t())
        logits = logits.view(*hidden_states.shape[:-1], self.rows)
        return tensor_model_parallel_all_gather(logits)[..., :self.num_embeddings] if self.tp > 1 else logits
