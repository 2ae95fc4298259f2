"""Qwen3NextAttention (vLLM): Qwen3-Next's full-attention block, one layer in four.

Llama-shaped attention with three differences, each a place a kernel can go wrong:

* an output gate: the query projection is twice as wide and holds, per head, the query followed
  by a gate of the same width (``[q_h | g_h]`` for each head h, as the checkpoint's ``q_proj``
  stores it); the attention output is multiplied by ``sigmoid(gate)`` before ``o_proj``;
* zero-centred q/k norms (:class:`GemmaRMSNorm`, ``1 + w``) per head, over head_dim 256;
* partial rotary: RoPE on the first quarter of each head (64 of 256 features, neox pairing).

The fused projection is ``[q_gate | k | v]``; the query and the gate are copied out of their
interleaved halves (as vLLM does), the key is normed as a strided view of the fused output.
"""
import torch
from torch import nn

from ..L1.attention import Attention
from ..L1.gemma_rms_norm import GemmaRMSNorm
from ..L1.linear import QKVParallelLinear, RowParallelLinear
from ..L1.rotary_emb import RotaryEmbedding
from ..native import run
from ..records import RecordsInit


class Qwen3NextAttention(RecordsInit, nn.Module):
    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 max_position_embeddings: int, rope_theta: float, partial_rotary_factor: float = 0.25,
                 rms_norm_eps: float = 1e-6, attention_bias: bool = False):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_size, self.kv_size = num_heads * head_dim, num_kv_heads * head_dim
        # Twice the query heads: each head's query and its gate come out of the one projection.
        self.qkv_proj = QKVParallelLinear(hidden_size, head_dim, 2 * num_heads, num_kv_heads, bias=attention_bias)
        self.o_proj = RowParallelLinear(self.q_size, hidden_size, bias=False)
        self.q_norm = GemmaRMSNorm(head_dim, eps=rms_norm_eps)
        self.k_norm = GemmaRMSNorm(head_dim, eps=rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(head_dim, int(head_dim * partial_rotary_factor), max_position_embeddings,
                                          rope_theta, is_neox_style=True)
        self.attn = Attention(num_heads, head_dim, head_dim ** -0.5, num_kv_heads)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._forward(positions, hidden_states, native=False)

    def forward_native(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._forward(positions, hidden_states, native=True)

    def _forward(self, positions, hidden_states, native):
        t = hidden_states.shape[0]
        qkv = run(self.qkv_proj, native, hidden_states)
        q_gate, k, v = qkv.split([2 * self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, gate = q_gate.view(t, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        q = run(self.q_norm, native, q.contiguous()).view(t, self.q_size)
        k = run(self.k_norm, native, k.view(t, self.num_kv_heads, self.head_dim)).view(t, self.kv_size)
        q, k = run(self.rotary_emb, native, positions, q, k)
        out = run(self.attn, native, q, k, v)
        out = out * torch.sigmoid(gate.reshape(t, self.q_size))
        return run(self.o_proj, native, out)
