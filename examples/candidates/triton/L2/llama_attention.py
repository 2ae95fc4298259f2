"""LlamaAttention from this tree's L1 modules: qkv projection, per-head q/k RMSNorm (Qwen3),
RoPE, paged attention, output projection."""
from torch import nn

from kernels_reference.parallel_state import get_tensor_model_parallel_world_size

from ..L1.attention import Attention
from ..L1.linear import QKVParallelLinear, RowParallelLinear
from ..L1.rms_norm import RMSNorm
from ..L1.rotary_emb import RotaryEmbedding


class LlamaAttention(nn.Module):
    def __init__(self, hidden_size, num_heads, num_kv_heads, head_dim, max_position_embeddings, rope_theta,
                 rope_scaling=None, rms_norm_eps=1e-6, qkv_bias=False, qk_norm=False):
        super().__init__()
        tp = get_tensor_model_parallel_world_size()  # each rank: its share of the heads
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads // tp, max(1, num_kv_heads // tp), head_dim
        self.q_size, self.kv_size = self.num_heads * head_dim, self.num_kv_heads * head_dim
        self.qkv_proj = QKVParallelLinear(hidden_size, head_dim, num_heads, num_kv_heads, bias=qkv_bias)
        self.o_proj = RowParallelLinear(num_heads * head_dim, hidden_size, bias=False)
        self.rotary_emb = RotaryEmbedding(head_dim, head_dim, max_position_embeddings, rope_theta,
                                          is_neox_style=True, rope_scaling=rope_scaling)
        self.attn = Attention(self.num_heads, head_dim, head_dim ** -0.5, self.num_kv_heads)
        self.qk_norm = qk_norm
        if qk_norm:
            self.q_norm = RMSNorm(head_dim, eps=rms_norm_eps)
            self.k_norm = RMSNorm(head_dim, eps=rms_norm_eps)

    def forward(self, positions, hidden_states):
        qkv = self.qkv_proj(hidden_states)
        t = qkv.shape[0]
        q = qkv[:, : self.q_size]  # column views of the fused output: no copies
        k = qkv[:, self.q_size: self.q_size + self.kv_size]
        v = qkv[:, self.q_size + self.kv_size:]
        if self.qk_norm:
            q = self.q_norm(q.reshape(t, self.num_heads, self.head_dim)).reshape(t, self.q_size)
            k = self.k_norm(k.reshape(t, self.num_kv_heads, self.head_dim)).reshape(t, self.kv_size)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v))
