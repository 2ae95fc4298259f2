# Wrong: reads the fused query projection as [all queries | all gates] instead of each head's
# [q | gate] pair (the checkpoint's q_proj layout). Shapes all fit; every output is wrong.
import torch
from torch import nn

from kernels_reference.L1.attention import Attention
from kernels_reference.L1.gemma_rms_norm import GemmaRMSNorm
from kernels_reference.L1.linear import QKVParallelLinear, RowParallelLinear
from kernels_reference.L1.rotary_emb import RotaryEmbedding


class Qwen3NextAttention(nn.Module):
    def __init__(self, hidden_size, num_heads, num_kv_heads, head_dim, max_position_embeddings, rope_theta,
                 partial_rotary_factor=0.25, rms_norm_eps=1e-6, attention_bias=False):
        super().__init__()
        self.nh, self.nk, self.d = num_heads, num_kv_heads, head_dim
        self.qkv_proj = QKVParallelLinear(hidden_size, head_dim, 2 * num_heads, num_kv_heads, bias=attention_bias)
        self.o_proj = RowParallelLinear(num_heads * head_dim, hidden_size, bias=False)
        self.q_norm = GemmaRMSNorm(head_dim, eps=rms_norm_eps)
        self.k_norm = GemmaRMSNorm(head_dim, eps=rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(head_dim, int(head_dim * partial_rotary_factor), max_position_embeddings,
                                          rope_theta, is_neox_style=True)
        self.attn = Attention(num_heads, head_dim, head_dim ** -0.5, num_kv_heads)

    def forward(self, positions, hidden_states):
        qs, ks = self.nh * self.d, self.nk * self.d
        q, gate, k, v = self.qkv_proj(hidden_states).split([qs, qs, ks, ks], dim=-1)
        t = q.shape[0]
        q = self.q_norm(q.reshape(t, self.nh, self.d)).reshape(t, qs)
        k = self.k_norm(k.reshape(t, self.nk, self.d)).reshape(t, ks)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v) * torch.sigmoid(gate))
