"""MixtralForCausalLM (vLLM): the Llama model with MixtralDecoderLayer (every layer's MLP is the
MoE block), same interface (forward, compute_logits, allocate_kv_cache, load_weights,
load_safetensors), so the engine serves it unchanged.

Checkpoints: the Hub's ``block_sparse_moe.experts.{e}.w1/w2/w3`` and transformers 5's
``mlp.experts.gate_up_proj`` / ``down_proj`` both load (see ``LlamaForCausalLM.load_weights``).
"""
from torch import nn

from ..L3.mixtral_decoder_layer import MixtralDecoderLayer
from .llama import LlamaForCausalLM, LlamaModel


class MixtralModel(LlamaModel):
    def make_layer(self, config, layer_idx: int) -> nn.Module:
        return MixtralDecoderLayer(config)


class MixtralForCausalLM(LlamaForCausalLM):
    model_class = MixtralModel
    checkpoint_renames = ((".mlp.", ".block_sparse_moe."),)  # transformers 5 renamed the block
