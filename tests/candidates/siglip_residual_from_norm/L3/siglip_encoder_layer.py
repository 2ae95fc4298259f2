# WRONG: the residual is taken after layer_norm1 / layer_norm2 (the normed tensor reassigned before the
# add), so each branch is added to the normed stream and the block loses the stream's scale.
from kernels_reference.L3.siglip_encoder_layer import SiglipEncoderLayer as _Ref


class SiglipEncoderLayer(_Ref):
    def forward(self, hidden_states):
        hidden_states = self.layer_norm1(hidden_states)
        hidden_states = hidden_states + self.self_attn(hidden_states)
        hidden_states = self.layer_norm2(hidden_states)
        return hidden_states + self.mlp(hidden_states)
