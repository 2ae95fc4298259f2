# HONEST L4 candidate: its own model loop over reference layers.
from torch import nn

from kernels_reference.L1.rms_norm import RMSNorm
from kernels_reference.L1.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from kernels_reference.L3.llama_decoder_layer import LlamaDecoderLayer


class _Body(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, eps=c.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.model = _Body(config)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids, positions):
        h, residual = self.model.embed_tokens(input_ids), None
        for layer in self.model.layers:
            h, residual = layer(positions, h, residual)
        h, _ = self.model.norm(h, residual)
        return h
