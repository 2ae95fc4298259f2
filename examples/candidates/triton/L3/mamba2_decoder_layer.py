"""Mamba2DecoderLayer from this tree's modules: the Triton RMSNorm folds the incoming residual in
(or, on the first layer, starts the residual stream from the input), the tree's mixer follows."""
from torch import nn

from ..L1.rms_norm import RMSNorm
from ..L2.mamba_mixer2 import MambaMixer2


class Mamba2DecoderLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        c = config
        width = c.num_heads * c.head_dim
        self.mixer = MambaMixer2(c.hidden_size, c.state_size, c.conv_kernel, width, c.use_conv_bias, c.use_bias,
                                 n_groups=c.n_groups, num_heads=c.num_heads, head_dim=c.head_dim,
                                 rms_norm_eps=c.layer_norm_epsilon, chunk_size=c.chunk_size)
        self.norm = RMSNorm(c.hidden_size, eps=c.layer_norm_epsilon)

    def forward(self, hidden_states, residual):
        if residual is None:
            normed, residual = self.norm(hidden_states), hidden_states
        else:
            normed, residual = self.norm(hidden_states, residual)
        return self.mixer(normed), residual
