"""Token embedding and LM head, as vLLM's ``VocabParallelEmbedding`` / ``ParallelLMHead``.

Simplification (documented): ``ParallelLMHead.forward(hidden)`` returns the logits (vLLM computes
them in a separate LogitsProcessor from the head's weight).
"""
import torch
import torch.nn.functional as F
from torch import nn
from ..records import RecordsInit


class VocabParallelEmbedding(RecordsInit, nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight)

    def forward_native(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight)


class ParallelLMHead(VocabParallelEmbedding):
    def __init__(self, num_embeddings: int, embedding_dim: int, bias: bool = False):
        super().__init__(num_embeddings, embedding_dim)
        self.bias = nn.Parameter(torch.empty(num_embeddings)) if bias else None

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden_states, self.weight, self.bias)

    def forward_native(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden_states, self.weight, self.bias)
