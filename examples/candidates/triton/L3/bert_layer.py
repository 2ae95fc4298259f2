"""BertLayer from this tree's modules: the attention block, then dense + Triton GELU (the dense's
bias folded into the activation) and dense + Triton add & norm."""
from torch import nn

from ..L1.gelu import GELU
from ..L1.layer_norm import LayerNorm
from ..L1.linear import ReplicatedLinear, RowParallelLinear
from ..L2.bert_attention import BertAttention

APPROXIMATE = {"gelu": "none", "gelu_pytorch_tanh": "tanh", "gelu_new": "tanh"}


class BertIntermediate(nn.Module):
    def __init__(self, hidden_size, intermediate_size, hidden_act):
        super().__init__()
        self.dense = ReplicatedLinear(hidden_size, intermediate_size, bias=True)
        self.intermediate_act_fn = GELU(APPROXIMATE[hidden_act])

    def forward(self, hidden_states):
        # GEMM without its bias, the bias added unrounded inside the activation
        pre = hidden_states @ self.dense.weight.t()
        return self.intermediate_act_fn(pre, self.dense.bias)


class BertOutput(nn.Module):
    def __init__(self, hidden_size, intermediate_size, layer_norm_eps):
        super().__init__()
        self.dense = RowParallelLinear(intermediate_size, hidden_size, bias=True)
        self.LayerNorm = LayerNorm(hidden_size, eps=layer_norm_eps)

    def forward(self, hidden_states, input_tensor):
        out, _ = self.LayerNorm(self.dense(hidden_states), input_tensor)
        return out


class BertLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        c = config
        self.attention = BertAttention(c.hidden_size, c.num_attention_heads, c.layer_norm_eps)
        self.intermediate = BertIntermediate(c.hidden_size, c.intermediate_size, c.hidden_act)
        self.output = BertOutput(c.hidden_size, c.intermediate_size, c.layer_norm_eps)

    def forward(self, hidden_states):
        attention_output = self.attention(hidden_states)
        return self.output(self.intermediate(attention_output), attention_output)
