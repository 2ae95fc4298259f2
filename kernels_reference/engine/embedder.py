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
``forward(input_ids[T], positions[T], prompt_lens[B]) -> [B, H]``. Images go through
:class:`ImageEmbedder` and :class:`ImageEmbeddingModel` instead: equal-size images stacked into a
padded batch, the tower's class token pooled.
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


# ---- images -----------------------------------------------------------------------------------------
class ImageEmbeddingModel(RecordsInit, nn.Module):
    """An image encoder (``forward(pixel_values[B, C, H, W]) -> last_hidden_state[B, S, D]``) and its
    pooler, which reads the padded batch as B packed sequences of S rows (the class token is row 0
    of each: ``Pooler("CLS")`` gives Hugging Face's ``pooler_output``, L2 normalised for retrieval)."""

    def __init__(self, model: nn.Module, pooler: nn.Module):
        super().__init__()
        self.model = model
        self.pooler = pooler
        self.config = getattr(model, "config", None)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        hidden = self.model(pixel_values)
        b, s, d = hidden.shape
        return self.pooler(hidden.reshape(b * s, d), torch.full((b,), s, dtype=torch.int32, device=hidden.device))


class ImageEmbedder:
    """Serves an :class:`ImageEmbeddingModel` for image embedding requests (``[C, H, W]`` float
    pixels, already preprocessed): consecutive requests of one size are stacked into batches of at
    most ``max_batch_size`` (a vision tower runs a padded batch of equal images), each batch one
    step in the model's dtype. ``embed`` returns one embedding per image, in request order."""

    def __init__(self, model: nn.Module, max_batch_size: int = 64):
        if max_batch_size < 1:
            raise ValueError(f"ImageEmbedder needs max_batch_size >= 1, got {max_batch_size}")
        self.model = model
        self.max_batch_size = max_batch_size
        self.steps = 0

    @torch.no_grad()
    def embed(self, images: Sequence[torch.Tensor]) -> torch.Tensor:
        if len(images) == 0:
            raise ValueError("ImageEmbedder.embed got an empty batch: no images to embed")
        for i, image in enumerate(images):
            if not isinstance(image, torch.Tensor) or image.dim() != 3:
                raise ValueError(f"image {i} must be a [channels, height, width] tensor, got "
                                 f"{tuple(image.shape) if isinstance(image, torch.Tensor) else type(image).__name__}")
        param = next(self.model.parameters())
        out, start = [], 0
        while start < len(images):
            end = start + 1
            while (end < len(images) and end - start < self.max_batch_size
                   and images[end].shape == images[start].shape):
                end += 1
            batch = torch.stack(list(images[start:end])).to(device=param.device, dtype=param.dtype)
            out.append(self.model(batch))
            self.steps += 1
            start = end
        return torch.cat(out)
