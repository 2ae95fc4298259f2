"""Token embedding and LM head, as vLLM's ``VocabParallelEmbedding`` / ``ParallelLMHead``.

Simplification (documented): ``ParallelLMHead.forward(hidden)`` returns the logits (vLLM computes
them in a separate LogitsProcessor from the head's weight).

The embedding's fast path on CUDA is a Triton row gather (a program per token and column block,
16-byte vector loads, autotuned). Ids outside ``[0, num_embeddings)`` give rows of zeros there, as
vLLM's masked lookup does for ids outside a tensor-parallel shard; ``forward_native`` stays
``F.embedding``, which raises on them. Checking the ids on the host would cost a device sync per
step and break CUDA-graph capture, so the fast path does not raise. The LM head keeps ``F.linear``.

Under tensor parallelism (:mod:`kernels_reference.parallel_state`) the vocabulary is padded to a
multiple of ``padding_size`` (vLLM's 64) and split into equal row ranges: rank r holds rows
[r * V / tp, (r + 1) * V / tp). The embedding looks up the ids inside its range (zero rows for the
rest: vLLM's masked lookup) and all-reduces; the head computes its range's logits and all-gathers
them, the padding cut off. ``shard_checkpoint`` cuts the full table to this rank's rows.
"""
import torch
import torch.nn.functional as F
from torch import nn

from ..dispatch import use_fast_path
from ..parallel_state import (divide, get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size,
                              tensor_model_parallel_all_gather, tensor_model_parallel_all_reduce)
from ..records import RecordsInit
from ..triton_rows import autotune, autotune_here, size_class

try:
    import triton
    import triton.language as tl
except ImportError:  # the native path still works without Triton
    triton = None


DEFAULT_VOCAB_PADDING_SIZE = 64  # vLLM's


class VocabParallelEmbedding(RecordsInit, nn.Module):
    RECORDED_WHEN_PASSED = ("padding_size",)

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_size: int = DEFAULT_VOCAB_PADDING_SIZE):
        super().__init__()
        self.tp_size, self.tp_rank = get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        # One GPU holds the table as it is; a sharded one is padded so that the ranks split it evenly.
        padded = num_embeddings if self.tp_size == 1 else -(-num_embeddings // padding_size) * padding_size
        self.num_embeddings_padded = padded
        self.num_embeddings_per_partition = divide(padded, self.tp_size)
        self.vocab_start_index = self.tp_rank * self.num_embeddings_per_partition
        self.weight = nn.Parameter(torch.empty(self.num_embeddings_per_partition, embedding_dim))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if triton is not None and use_fast_path(input_ids, self.weight):
            return self.forward_triton(input_ids)
        return self.forward_native(input_ids)

    def forward_native(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.vocab_start_index
        outside = (local < 0) | (local >= self.num_embeddings_per_partition)
        rows = F.embedding(local.masked_fill(outside, 0), self.weight).masked_fill(outside.unsqueeze(-1), 0)
        return tensor_model_parallel_all_reduce(rows)

    def forward_triton(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return self._gather_rows(input_ids)
        # The kernel writes zero rows for ids outside its table: this rank's range, shifted to 0.
        return tensor_model_parallel_all_reduce(self._gather_rows(input_ids - self.vocab_start_index))

    def shard_checkpoint(self, param: str, tensor: torch.Tensor, shard=None) -> torch.Tensor:
        """This rank's rows of the full table (or head bias), zero-padded to the padded vocabulary."""
        if self.tp_size == 1:
            return tensor
        padded = tensor.new_zeros((self.num_embeddings_padded, *tensor.shape[1:]))
        padded[:tensor.shape[0]] = tensor
        return padded.narrow(0, self.vocab_start_index, self.num_embeddings_per_partition)

    def _gather_rows(self, input_ids: torch.Tensor) -> torch.Tensor:
        if input_ids.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"token ids must be int32 or int64, got {input_ids.dtype}")
        if input_ids.device != self.weight.device:
            raise ValueError(f"ids on {input_ids.device}, embedding table on {self.weight.device}")
        weight = self.weight if self.weight.stride(-1) == 1 else self.weight.contiguous()
        ids = input_ids.reshape(-1)  # ids are tiny: a copy of a strided id tensor costs nothing
        width = self.embedding_dim
        out = torch.empty((*input_ids.shape, width), dtype=weight.dtype, device=weight.device)
        n_tokens = ids.numel()
        if n_tokens == 0 or width == 0:
            return out
        args = (ids, weight, out, weight.shape[0], width, weight.stride(0), size_class(n_tokens))
        if autotune_here(weight):
            grid = lambda meta: (n_tokens, triton.cdiv(width, meta["BLOCK"]))  # noqa: E731
            _embedding_tuned[grid](*args)
        else:
            # the interpreter (CPU): a whole row per program (it pays per program, not per element)
            block = triton.next_power_of_2(width) if not weight.is_cuda else min(1024, triton.next_power_of_2(width))
            _embedding_kernel[(n_tokens, triton.cdiv(width, block))](*args, BLOCK=block, num_warps=4)
        return out


class ParallelLMHead(VocabParallelEmbedding):
    def __init__(self, num_embeddings: int, embedding_dim: int, bias: bool = False,
                 padding_size: int = DEFAULT_VOCAB_PADDING_SIZE):
        super().__init__(num_embeddings, embedding_dim, padding_size)
        self.bias = nn.Parameter(torch.empty(self.num_embeddings_per_partition)) if bias else None

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._logits(hidden_states)

    def forward_native(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._logits(hidden_states)

    def _logits(self, hidden_states):
        logits = F.linear(hidden_states, self.weight, self.bias)
        if self.tp_size == 1:
            return logits
        return tensor_model_parallel_all_gather(logits)[..., :self.num_embeddings]

    # The head's fast path is cuBLAS (``forward``); the embedding's row gather is not its kernel.
    forward_triton = None


if triton is not None:

    @triton.jit(do_not_specialize=["size_cls"])
    def _embedding_kernel(ids_ptr, w_ptr, out_ptr, vocab, width, w_row_stride,
                          size_cls,  # only an autotune key (the token-count bucket)
                          BLOCK: tl.constexpr):
        token = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        idx = tl.load(ids_ptr + token).to(tl.int64)
        in_range = (idx >= 0) & (idx < vocab)
        idx = tl.where(in_range, idx, 0)  # never form an address outside the table
        mask = cols < width
        # An out-of-range id reads no columns (its row stays the `other` zeros); a bound rather
        # than `mask & in_range` since scalar-and-block masks trip the interpreter.
        load_mask = cols < tl.where(in_range, width, 0)
        # Table rows are left to the cache's default policy: a prompt repeats tokens.
        row = tl.load(w_ptr + idx * w_row_stride + cols, mask=load_mask, other=0.0)
        tl.store(out_ptr + token * width + cols, row, mask=mask)

    # A pure copy: 8 to 16 elements (one or two 16-byte bf16 vectors) per thread, from a quarter
    # row per program (more programs for a decode step's single token) to a whole 4096 row.
    _embedding_tuned = autotune(
        configs=[triton.Config({"BLOCK": b}, num_warps=nw, num_stages=1)
                 for b, nw in ((512, 2), (1024, 4), (1024, 2), (2048, 8), (2048, 4), (4096, 8))],
        key=["width", "size_cls"],
    )(_embedding_kernel)
