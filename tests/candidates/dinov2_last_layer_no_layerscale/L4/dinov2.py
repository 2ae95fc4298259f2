# WRONG: the last layer adds its attention and MLP branches without their LayerScale gains (an
# export that folds each gain into the projection before it and stops one layer short, so the
# last layer's gains act as 1).
from kernels_reference.L4.dinov2 import Dinov2Model as _Ref


class Dinov2Model(_Ref):
    def forward(self, pixel_values):
        hidden_states = self.embeddings(pixel_values)
        *layers, last = self.encoder.layer
        for layer in layers:
            hidden_states = layer(hidden_states)
        hidden_states = hidden_states + last.attention(last.norm1(hidden_states))
        hidden_states = hidden_states + last.mlp(last.norm2(hidden_states))
        return self.layernorm(hidden_states)
