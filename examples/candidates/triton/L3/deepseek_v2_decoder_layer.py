"""DeepseekV2DecoderLayer from this tree's modules: MLA attention, then the dense MLP (layers before
first_k_dense_replace) or the MoE block with shared experts, in the Llama layer's pre-norm order."""
from torch import nn

from ..L1.rms_norm import RMSNorm
from ..L2.deepseek_v2_attention import DeepseekV2MLAAttention
from ..L2.deepseek_v2_moe import DeepseekV2MoE
from ..L2.llama_mlp import LlamaMLP
from .mixtral_decoder_layer import pre_norm


class DeepseekV2DecoderLayer(nn.Module):
    def __init__(self, config, layer_idx=0):
        super().__init__()
        c, m = config, config.moe
        self.self_attn = DeepseekV2MLAAttention(
            c.hidden_size, c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim,
            c.q_lora_rank, c.kv_lora_rank, c.rope_theta, c.rope_scaling, c.max_position_embeddings, c.rms_norm_eps)
        if layer_idx >= m.first_k_dense_replace and layer_idx % m.moe_layer_freq == 0:
            self.mlp = DeepseekV2MoE(c.hidden_size, m.moe_intermediate_size, m.n_routed_experts,
                                     m.num_experts_per_tok, m.n_shared_experts, m.norm_topk_prob,
                                     m.routed_scaling_factor)
        else:
            self.mlp = LlamaMLP(c.hidden_size, c.intermediate_size)
        self.input_layernorm = RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, eps=c.rms_norm_eps)

    def forward(self, positions, hidden_states, residual):
        return pre_norm(self, self.mlp, positions, hidden_states, residual)
