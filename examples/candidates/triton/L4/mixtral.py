"""MixtralForCausalLM from this tree's modules: this tree's Llama model with Mixtral's layers."""
from torch import nn

from ..L3.mixtral_decoder_layer import MixtralDecoderLayer
from .llama import LlamaForCausalLM


class MixtralForCausalLM(LlamaForCausalLM):
    def __init__(self, config):
        super().__init__(config)
        self.model.layers = nn.ModuleList(MixtralDecoderLayer(self.config)
                                          for _ in range(self.config.num_hidden_layers))
