# WRONG: the final norm drops the last layer's residual stream (norm of the MoE output alone).
from kernels_reference.L4.deepseek_v2 import DeepseekV2ForCausalLM as _Ref


class DeepseekV2ForCausalLM(_Ref):
    def forward(self, input_ids, positions):
        body = self.model
        hidden_states, residual = body.embed_tokens(input_ids), None
        for layer in body.layers:
            hidden_states, residual = layer(positions, hidden_states, residual)
        return body.norm(hidden_states)
