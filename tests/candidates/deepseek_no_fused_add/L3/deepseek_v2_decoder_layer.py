# WRONG: the post-attention norm without the fused residual add: the attention output is normalised
# alone and never joins the residual stream (the MoE sees the wrong input, the residual is stale).
from kernels_reference.L3.deepseek_v2_decoder_layer import DeepseekV2DecoderLayer as _Ref


class DeepseekV2DecoderLayer(_Ref):
    def forward(self, positions, hidden_states, residual):
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.post_attention_layernorm(self.self_attn(positions, hidden_states))
        return self.mlp(hidden_states), residual
