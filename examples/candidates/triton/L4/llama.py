"""LlamaForCausalLM (and the Qwen2 / Qwen3 / Mistral names, which differ only by config switches)
from this tree's modules: embedding, decoder layers, final norm; logits from the LM head."""
from torch import nn

from kernels_reference.model_config import LlamaArchConfig

from ..L1.rms_norm import RMSNorm
from ..L1.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from ..L3.llama_decoder_layer import LlamaDecoderLayer


class LlamaModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, input_ids, positions):
        hidden_states, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            hidden_states, residual = layer(positions, hidden_states, residual)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class LlamaForCausalLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        if not isinstance(config, LlamaArchConfig):  # an HF config (object or dict)
            config = LlamaArchConfig.from_hf(config)
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids, positions):
        return self.model(input_ids, positions)

    def compute_logits(self, hidden_states):
        return self.lm_head(hidden_states)


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Qwen2 / Qwen2.5: q/k/v biases (``config.qkv_bias``)."""


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Qwen3: per-head q/k RMSNorm (``config.qk_norm``)."""


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral-7B-v0.3: the Llama architecture."""
