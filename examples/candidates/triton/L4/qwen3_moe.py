"""Qwen3MoeForCausalLM from this tree's modules: this tree's Llama model with Qwen3-MoE's layers."""
from torch import nn

from ..L3.qwen3_moe_decoder_layer import Qwen3MoeDecoderLayer
from .llama import LlamaForCausalLM


class Qwen3MoeForCausalLM(LlamaForCausalLM):
    def __init__(self, config):
        super().__init__(config)
        self.model.layers = nn.ModuleList(Qwen3MoeDecoderLayer(self.config, i)
                                          for i in range(self.config.num_hidden_layers))
