"""``Embedder(model).embed(prompts)``: the engine's runner for embedding requests, as an embedding
server (vLLM's pooling runner for ``embed`` requests) batches them.

An encoder request is one forward pass over its whole prompt: no KV cache, no decode steps, no
chunking (bidirectional attention needs every token of a sequence in the same step). The
scheduler packs waiting requests in arrival order into steps of at most ``max_num_batched_tokens``
tokens and ``max_num_seqs`` sequences; a step is one packed batch (the sequences' token ids
concatenated, cu_seqlens and 0-based positions in the forward context, as vLLM runs encoders
through its varlen attention) and ends in the pooler, which turns each sequence's rows into one
embedding. A prompt longer than the token budget or the model's positions is refused with an error
naming it, as a server refuses it, before any step runs.

Models: :class:`EmbeddingModel` (an L4 encoder and its pooler) or any module with the same
``forward(input_ids[T], positions[T], prompt_lens[B]) -> [B, H]``.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence

import torch
from torch import nn

from ..forward_context import AttentionMetadata, set_forward_context
from ..records import RecordsInit

# The forward context also plans paged caches; an encoder keeps none, so any block size will do.
_BLOCK_SIZE = 16


class EmbeddingModel(RecordsInit, nn.Module):
    """What an embedding server runs per step: ``model`` (an L4 encoder, ``forward(input_ids,
    positions)`` over a packed batch) then ``pooler`` (``forward(hidden_states, prompt_lens)``, one
    row per sequence). Both are children, so a candidate's encoder or pooler is swapped in like any
    other class of the tree."""

    def __init__(self, model: nn.Module, pooler: nn.Module):
        super().__init__()
        self.model = model
        self.pooler = pooler
        self.config = getattr(model, "config", None)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, prompt_lens: torch.Tensor) -> torch.Tensor:
        return self.pooler(self.model(input_ids, positions), prompt_lens)


@dataclasses.dataclass
class EmbedStep:
    """One scheduled step: which requests (indices into the call's prompts), packed in this order."""

    requests: List[int]
    tokens: int


def schedule(lengths: Sequence[int], max_num_batched_tokens: int, max_num_seqs: int) -> List[EmbedStep]:
    """First come, first served: each step takes the next waiting requests while they fit the token
    budget and the sequence limit (a request is never split). ``lengths`` must each fit the budget."""
    steps: List[EmbedStep] = []
    for i, n in enumerate(lengths):
        if steps and steps[-1].tokens + n <= max_num_batched_tokens and len(steps[-1].requests) < max_num_seqs:
            steps[-1].requests.append(i)
            steps[-1].tokens += n
        else:
            steps.append(EmbedStep([i], n))
    return steps


class Embedder:
    """Serves ``model`` for embedding requests (token id lists): ``embed`` returns one float32
    embedding per prompt (the pooler's dtype; float64 for a float64 model), in prompt order.
    ``steps`` counts the packed steps run so far."""

    def __init__(self, model: nn.Module, max_num_batched_tokens: int = 8192, max_num_seqs: int = 256,
                 max_position_embeddings: Optional[int] = None):
        if max_num_batched_tokens < 1 or max_num_seqs < 1:
            raise ValueError(f"Embedder needs max_num_batched_tokens >= 1 and max_num_seqs >= 1, got "
                             f"{max_num_batched_tokens} and {max_num_seqs}")
        self.model = model
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        config = getattr(model, "config", None)
        if max_position_embeddings is None and getattr(config, "max_position_embeddings", None) is not None:
            # XLM-R's table starts after its padding index: position_offset rows are not positions.
            max_position_embeddings = config.max_position_embeddings - getattr(config, "position_offset", 0)
        self.max_len = max_position_embeddings
        self.steps = 0

    def _check(self, prompts: Sequence[Sequence[int]]) -> None:
        if not prompts:
            raise ValueError("Embedder.embed got an empty batch: no prompts to embed")
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ValueError(f"prompt {i} is empty: an embedding needs at least one token")
            if len(p) > self.max_num_batched_tokens:
                raise ValueError(f"prompt {i} has {len(p)} tokens, more than the engine's max_num_batched_tokens "
                                 f"({self.max_num_batched_tokens}): an encoder prompt is never split")
            if self.max_len is not None and len(p) > self.max_len:
                raise ValueError(f"prompt {i} has {len(p)} tokens, more than the model's "
                                 f"max_position_embeddings ({self.max_len})")

    @torch.no_grad()
    def embed(self, prompts: Sequence[Sequence[int]]) -> torch.Tensor:
        self._check(prompts)
        device = next(self.model.parameters()).device
        lengths = [len(p) for p in prompts]
        out: List[Optional[torch.Tensor]] = [None] * len(prompts)
        for step in schedule(lengths, self.max_num_batched_tokens, self.max_num_seqs):
            pooled = self.run_step([prompts[i] for i in step.requests], device)
            for row, i in enumerate(step.requests):
                out[i] = pooled[row]
        return torch.stack(out)

    def run_step(self, prompts: Sequence[Sequence[int]], device) -> torch.Tensor:
        """One packed step: ``[len(prompts), H]``."""
        lengths = [len(p) for p in prompts]
        input_ids = torch.tensor([t for p in prompts for t in p], dtype=torch.long, device=device)
        meta = AttentionMetadata.build([0] * len(lengths), lengths, block_size=_BLOCK_SIZE, device=device)
        with set_forward_context(meta):
            pooled = self.model(input_ids, meta.positions(), torch.tensor(lengths, dtype=torch.int32, device=device))
        self.steps += 1
        if pooled.shape[0] != len(prompts):
            raise RuntimeError(f"the model returned {pooled.shape[0]} embeddings for a step of {len(prompts)} "
                               "sequences (its pooler must return one row per sequence)")
        return pooled
