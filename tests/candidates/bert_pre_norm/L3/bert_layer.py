# WRONG: a pre-norm layer (norm before each sublayer, residual carried un-normed), BERT is post-norm.
from kernels_reference.L3.bert_layer import BertLayer as _Reference


class BertLayer(_Reference):
    def forward(self, hidden_states):
        attn = self.attention
        normed = attn.output.LayerNorm(hidden_states)
        hidden_states = hidden_states + attn.output.dense(attn.self(normed))
        normed = self.output.LayerNorm(hidden_states)
        return hidden_states + self.output.dense(self.intermediate(normed))
