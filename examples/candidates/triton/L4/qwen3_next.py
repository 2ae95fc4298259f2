"""Qwen3NextForCausalLM from this tree's modules: embedding, this tree's Qwen3-Next layers in the
config's order of layer types, the zero-centred final norm, the LM head."""
from torch import nn

from kernels_reference.qwen3_next_config import Qwen3NextArchConfig

from ..L1.gemma_rms_norm import GemmaRMSNorm
from ..L1.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from ..L3.qwen3_next_decoder_layer import Qwen3NextDecoderLayer


class Qwen3NextModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Qwen3NextDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, input_ids, positions):
        hidden_states, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            hidden_states, residual = layer(positions, hidden_states, residual)
        return self.norm(hidden_states, residual)[0]


class Qwen3NextForCausalLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config if isinstance(config, Qwen3NextArchConfig) else Qwen3NextArchConfig.from_hf(config)
        self.model = Qwen3NextModel(self.config)
        self.lm_head = ParallelLMHead(self.config.vocab_size, self.config.hidden_size)
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids, positions):
        return self.model(input_ids, positions)

    def compute_logits(self, hidden_states):
        return self.lm_head(hidden_states)
