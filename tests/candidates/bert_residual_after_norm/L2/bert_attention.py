# WRONG: the residual is added after the norm, LayerNorm(dense(x)) + x, instead of LayerNorm(dense(x) + x)
# (a pre-norm habit carried into a post-norm block).
from kernels_reference.L2.bert_attention import BertAttention as _Reference


class BertAttention(_Reference):
    def forward(self, hidden_states):
        block = self.output
        return block.LayerNorm(block.dense(self.self(hidden_states))) + hidden_states
