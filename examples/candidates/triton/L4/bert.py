"""BertModel from this tree's modules: the three Triton embedding gathers and a Triton LayerNorm,
then the encoder layers. Positions arrive 0-based; XLM-R's start after its padding row
(``config.position_offset``)."""
import torch
from torch import nn

from ..L1.layer_norm import LayerNorm
from ..L1.vocab_parallel_embedding import VocabParallelEmbedding
from ..L3.bert_layer import BertLayer


class BertEmbedding(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.position_offset = config.position_offset
        self.word_embeddings = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = VocabParallelEmbedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = VocabParallelEmbedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, input_ids, positions, token_type_ids=None):
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        words = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        # the position rows join inside the norm kernel (fused add)
        out, _ = self.LayerNorm(words, self.position_embeddings(positions + self.position_offset))
        return out


class BertEncoder(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, hidden_states):
        for layer in self.layer:
            hidden_states = layer(hidden_states)
        return hidden_states


class BertModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embeddings = BertEmbedding(config)
        self.encoder = BertEncoder(config)

    def forward(self, input_ids, positions, token_type_ids=None):
        return self.encoder(self.embeddings(input_ids, positions, token_type_ids))
