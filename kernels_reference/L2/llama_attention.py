"""LlamaAttention (vLLM): fused qkv projection, optional per-head q/k RMSNorm (Qwen3), RoPE,
paged attention, output projection. ``qkv_bias`` covers Qwen2.

Under tensor parallelism (:mod:`kernels_reference.parallel_state`, read when built) each rank holds
``num_heads / tp`` query heads and its KV heads (``num_kv_heads / tp``, or one replicated KV head
when the degree exceeds them), as vLLM's layer: ``QKVParallelLinear`` produces this rank's q, k and
v, the attention and the rank's KV cache cover only those heads, and ``o_proj`` all-reduces the
partial outputs, so every rank ends with the whole hidden state."""
from typing import Optional

import torch
from torch import nn

from ..L1.attention import Attention
from ..L1.linear import QKVParallelLinear, RowParallelLinear
from ..L1.rms_norm import RMSNorm
from ..L1.rotary_emb import RotaryEmbedding
from ..native import run
from ..parallel_state import divide, get_tensor_model_parallel_world_size
from ..records import RecordsInit


class LlamaAttention(RecordsInit, nn.Module):
    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 max_position_embeddings: int, rope_theta: float, rope_scaling: Optional[dict] = None,
                 rms_norm_eps: float = 1e-6, qkv_bias: bool = False, qk_norm: bool = False):
        super().__init__()
        tp = get_tensor_model_parallel_world_size()
        self.qkv_proj = QKVParallelLinear(hidden_size, head_dim, num_heads, num_kv_heads, bias=qkv_bias)
        # this rank's heads (the projection has checked that the degree fits the head counts)
        self.num_heads, self.num_kv_heads, self.head_dim = divide(num_heads, tp), max(1, num_kv_heads // tp), head_dim
        self.q_size, self.kv_size = self.num_heads * head_dim, self.num_kv_heads * head_dim
        self.o_proj = RowParallelLinear(num_heads * head_dim, hidden_size, bias=False)
        self.rotary_emb = RotaryEmbedding(head_dim, head_dim, max_position_embeddings, rope_theta,
                                          is_neox_style=True, rope_scaling=rope_scaling)
        self.attn = Attention(self.num_heads, head_dim, head_dim ** -0.5, self.num_kv_heads)
        self.qk_norm = qk_norm
        if qk_norm:
            self.q_norm = RMSNorm(head_dim, eps=rms_norm_eps)
            self.k_norm = RMSNorm(head_dim, eps=rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._forward(positions, hidden_states, native=False)

    def forward_native(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._forward(positions, hidden_states, native=True)

    def _forward(self, positions, hidden_states, native):
        qkv = run(self.qkv_proj, native, hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.qk_norm:  # per head, on strided views of the fused output (as Qwen3 in vLLM)
            t = q.shape[0]
            q = run(self.q_norm, native, q.view(t, self.num_heads, self.head_dim)).view(t, self.q_size)
            k = run(self.k_norm, native, k.view(t, self.num_kv_heads, self.head_dim)).view(t, self.kv_size)
        q, k = run(self.rotary_emb, native, positions, q, k)
        return run(self.o_proj, native, run(self.attn, native, q, k, v))
