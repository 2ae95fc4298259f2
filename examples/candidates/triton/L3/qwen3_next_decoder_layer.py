"""Qwen3NextDecoderLayer from this tree's modules: the token mixer picked by the config's layer type
(gated DeltaNet or gated attention), the MoE block with its shared expert (a dense MLP off the
sparse grid), and zero-centred norms that fuse the residual add."""
from torch import nn

from ..L1.gemma_rms_norm import GemmaRMSNorm
from ..L2.llama_mlp import LlamaMLP
from ..L2.qwen3_next_attention import Qwen3NextAttention
from ..L2.qwen3_next_gated_delta_net import Qwen3NextGatedDeltaNet
from ..L2.qwen3_next_moe import Qwen3NextSparseMoeBlock


def _mixer(c, kind):
    if kind == "linear_attention":
        return "linear_attn", Qwen3NextGatedDeltaNet(
            c.hidden_size, c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim,
            c.linear_value_head_dim, c.linear_conv_kernel_dim, c.rms_norm_eps)
    return "self_attn", Qwen3NextAttention(
        c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.max_position_embeddings,
        c.rope_theta, c.partial_rotary_factor, c.rms_norm_eps, c.attention_bias)


class Qwen3NextDecoderLayer(nn.Module):
    def __init__(self, config, layer_idx=0):
        super().__init__()
        c = config
        self.layer_type = c.layer_types[layer_idx]
        name, mixer = _mixer(c, self.layer_type)
        setattr(self, name, mixer)
        self._takes_positions = name == "self_attn"
        self._mixer = name
        sparse = (c.num_experts > 0 and layer_idx not in c.mlp_only_layers
                  and (layer_idx + 1) % c.decoder_sparse_step == 0)
        self.mlp = Qwen3NextSparseMoeBlock(c.hidden_size, c.moe_intermediate_size, c.num_experts,
                                           c.num_experts_per_tok, c.norm_topk_prob,
                                           c.shared_expert_intermediate_size) if sparse else \
            LlamaMLP(c.hidden_size, c.intermediate_size, c.hidden_act)
        self.input_layernorm = GemmaRMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.post_attention_layernorm = GemmaRMSNorm(c.hidden_size, eps=c.rms_norm_eps)

    def forward(self, positions, hidden_states, residual):
        if residual is None:  # the first layer: its input starts the residual stream
            residual, hidden_states = hidden_states, self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        mixer = getattr(self, self._mixer)
        hidden_states = mixer(positions, hidden_states) if self._takes_positions else mixer(hidden_states)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual
