"""DeepseekV2ForCausalLM (vLLM): the Llama model's stack (embedding, layers, final norm, LM head)
with DeepseekV2DecoderLayer (MLA attention; dense MLP on the first ``first_k_dense_replace``
layers, MoE with shared experts on the rest), same interface as LlamaForCausalLM (forward,
compute_logits, allocate_kv_cache, load_weights, load_safetensors), so the engine serves it.

KV cache: one paged *latent* cache per layer, [num_blocks, block_size, kv_lora_rank + rope]
(576 values per token for V2-Lite), bound to each layer's ``MLAAttention``.

Checkpoints: HF names through the shared loader; ``self_attn.kv_b_proj`` lives in the MLA layer
(``self_attn.mla_attn.kv_b_proj``); experts as the Hub's ``mlp.experts.{e}.gate_proj/up_proj/
down_proj`` or transformers 5's fused ``mlp.experts.gate_up_proj`` / ``down_proj``.
"""
import torch
from torch import nn

from ..L3.deepseek_v2_decoder_layer import DeepseekV2DecoderLayer
from ..model_config import DeepseekV2ArchConfig
from .llama import LlamaForCausalLM, LlamaModel


class DeepseekV2Model(LlamaModel):
    def make_layer(self, config, layer_idx: int) -> nn.Module:
        return DeepseekV2DecoderLayer(config, layer_idx)


class DeepseekV2ForCausalLM(LlamaForCausalLM):
    model_class = DeepseekV2Model
    config_class = DeepseekV2ArchConfig
    checkpoint_renames = ((".self_attn.kv_b_proj.", ".self_attn.mla_attn.kv_b_proj."),)

    def attention_layers(self):
        return [layer.self_attn.mla_attn for layer in self.model.layers]

    def new_cache(self, num_blocks: int, block_size: int, dtype, device, kv_heads=None):  # MLA: no KV heads
        c = self.config
        return torch.zeros(num_blocks, block_size, c.kv_lora_rank + c.qk_rope_head_dim, dtype=dtype, device=device)
