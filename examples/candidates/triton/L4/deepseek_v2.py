"""DeepseekV2ForCausalLM from this tree's modules: this tree's Llama model body (embedding, layers,
final norm) and LM head with DeepSeek-V2's layers (layer 0 dense, the rest MoE)."""
from torch import nn

from kernels_reference.model_config import DeepseekV2ArchConfig

from ..L1.rms_norm import RMSNorm
from ..L1.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from ..L3.deepseek_v2_decoder_layer import DeepseekV2DecoderLayer
from .llama import LlamaModel


class DeepseekV2Model(LlamaModel):
    def __init__(self, config):
        nn.Module.__init__(self)  # LlamaModel's forward, DeepSeek's layers
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DeepseekV2DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)


class DeepseekV2ForCausalLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = DeepseekV2ArchConfig.from_hf(config)
        self.model = DeepseekV2Model(self.config)
        self.lm_head = ParallelLMHead(self.config.vocab_size, self.config.hidden_size)

    def forward(self, input_ids, positions):
        return self.model(input_ids, positions)

    def compute_logits(self, hidden_states):
        return self.lm_head(hidden_states)
