"""Mamba2ForCausalLM from this tree's modules: embedding lookup, the decoder layers passing the
residual stream along, the last residual folded in by norm_f, logits from the head that shares the
embedding table."""
from torch import nn

from ..L1.rms_norm import RMSNorm
from ..L1.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from ..L3.mamba2_decoder_layer import Mamba2DecoderLayer


class Mamba2Model(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embeddings = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([Mamba2DecoderLayer(config) for _ in range(config.num_hidden_layers)])
        self.norm_f = RMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)

    def forward(self, input_ids):
        hidden, residual = self.embeddings(input_ids), None
        for layer in self.layers:
            hidden, residual = layer(hidden, residual)
        return self.norm_f(hidden, residual)[0]


class Mamba2ForCausalLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.backbone = Mamba2Model(config)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.backbone.embeddings.weight

    def forward(self, input_ids, positions):  # positions: unused, a state-space model has none
        return self.backbone(input_ids)

    def compute_logits(self, hidden_states):
        return self.lm_head(hidden_states)
