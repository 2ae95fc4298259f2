# WRONG: LayerScale applied after the residual add, (x + branch) * lambda, so the gains also shrink
# the residual stream instead of the branch alone.
from kernels_reference.L3.dinov2_layer import Dinov2Layer as _Ref


class Dinov2Layer(_Ref):
    def forward(self, hidden_states):
        attended = self.attention(self.norm1(hidden_states))
        hidden_states = (hidden_states + attended) * self.layer_scale1.lambda1.to(hidden_states.dtype)
        mlp_out = self.mlp(self.norm2(hidden_states))
        return (hidden_states + mlp_out) * self.layer_scale2.lambda1.to(hidden_states.dtype)
