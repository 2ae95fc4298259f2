"""Qwen3NextAttention from this tree's L1 modules: the fused projection read as [q_gate | k | v],
query and gate as strided views of each head's [q | gate] pair, zero-centred q/k norms, partial
RoPE, paged attention, the sigmoid gate folded into one multiply before o_proj."""
import torch
from torch import nn

from ..L1.attention import Attention
from ..L1.gemma_rms_norm import GemmaRMSNorm
from ..L1.linear import QKVParallelLinear, RowParallelLinear
from ..L1.rotary_emb import RotaryEmbedding


class Qwen3NextAttention(nn.Module):
    def __init__(self, hidden_size, num_heads, num_kv_heads, head_dim, max_position_embeddings, rope_theta,
                 partial_rotary_factor=0.25, rms_norm_eps=1e-6, attention_bias=False):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_size, self.kv_size = num_heads * head_dim, num_kv_heads * head_dim
        self.qkv_proj = QKVParallelLinear(hidden_size, head_dim, 2 * num_heads, num_kv_heads, bias=attention_bias)
        self.o_proj = RowParallelLinear(self.q_size, hidden_size, bias=False)
        self.q_norm = GemmaRMSNorm(head_dim, eps=rms_norm_eps)
        self.k_norm = GemmaRMSNorm(head_dim, eps=rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(head_dim, int(head_dim * partial_rotary_factor), max_position_embeddings,
                                          rope_theta, is_neox_style=True)
        self.attn = Attention(num_heads, head_dim, head_dim ** -0.5, num_kv_heads)

    def forward(self, positions, hidden_states):
        qkv = self.qkv_proj(hidden_states)
        t, h, d = qkv.shape[0], self.num_heads, self.head_dim
        pairs = qkv[:, : 2 * self.q_size].view(t, h, 2, d)
        k = qkv[:, 2 * self.q_size: 2 * self.q_size + self.kv_size]
        v = qkv[:, 2 * self.q_size + self.kv_size:]
        q = self.q_norm(pairs[:, :, 0]).reshape(t, self.q_size)  # the norm reads the strided heads
        k = self.k_norm(k.reshape(t, self.num_kv_heads, d)).reshape(t, self.kv_size)
        q, k = self.rotary_emb(positions, q, k)
        gated = self.attn(q, k, v).view(t, h, d) * torch.sigmoid(pairs[:, :, 1])
        return self.o_proj(gated.reshape(t, self.q_size))
