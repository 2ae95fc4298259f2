"""Qwen3MoeForCausalLM (vLLM): the Llama model with Qwen3MoeDecoderLayer (per-head q/k norm;
the MoE block on sparse layers, a dense LlamaMLP on ``mlp_only_layers``), same interface as
LlamaForCausalLM, so the engine serves it unchanged.

Checkpoints: the Hub's ``mlp.experts.{e}.gate_proj/up_proj/down_proj`` and transformers 5's fused
``mlp.experts.gate_up_proj`` / ``down_proj`` both load.
"""
from torch import nn

from ..L3.qwen3_moe_decoder_layer import Qwen3MoeDecoderLayer
from .llama import LlamaForCausalLM, LlamaModel


class Qwen3MoeModel(LlamaModel):
    def make_layer(self, config, layer_idx: int) -> nn.Module:
        return Qwen3MoeDecoderLayer(config, layer_idx)


class Qwen3MoeForCausalLM(LlamaForCausalLM):
    model_class = Qwen3MoeModel
