"""BertAttention (vLLM): self-attention over a packed batch, then the output dense and the post-norm
"add & norm", ``LayerNorm(dense(attention) + hidden_states)``.

``forward(hidden_states[T, hidden]) -> [T, hidden]``; the sequences' boundaries are the forward
context's cu_seqlens (``EncoderOnlyAttention``). Parameter names follow vLLM's BERT (``self.qkv_proj``,
``output.dense``, ``output.LayerNorm``), which are HF's apart from the packed q/k/v. The add is fused
into the LayerNorm (float32 sum, one rounding), as the fast path of a post-norm block runs it.
"""
import torch
from torch import nn

from ..L1.encoder_attention import EncoderOnlyAttention
from ..L1.layer_norm import LayerNorm
from ..L1.linear import QKVParallelLinear, RowParallelLinear
from ..native import run
from ..records import RecordsInit


class BertSelfAttention(RecordsInit, nn.Module):
    def __init__(self, hidden_size: int, num_attention_heads: int):
        super().__init__()
        if hidden_size % num_attention_heads:
            raise ValueError(f"hidden size {hidden_size} is not a multiple of {num_attention_heads} heads")
        self.num_heads = num_attention_heads
        self.head_dim = hidden_size // num_attention_heads
        self.q_size = self.kv_size = hidden_size
        self.qkv_proj = QKVParallelLinear(hidden_size, self.head_dim, num_attention_heads, num_attention_heads,
                                          bias=True)
        self.attn = EncoderOnlyAttention(num_attention_heads, self.head_dim, self.head_dim ** -0.5)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._forward(hidden_states, native=False)

    def forward_native(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._forward(hidden_states, native=True)

    def _forward(self, hidden_states, native):
        qkv = run(self.qkv_proj, native, hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)  # column views, no copies
        return run(self.attn, native, q, k, v)


def dense_add_norm(block: nn.Module, hidden_states, input_tensor, native: bool):
    """``block.LayerNorm(block.dense(hidden_states) + input_tensor)``: the post-norm residual step of
    BertSelfOutput and BertOutput, the add fused into the norm."""
    out, _ = run(block.LayerNorm, native, run(block.dense, native, hidden_states), input_tensor)
    return out


class BertSelfOutput(RecordsInit, nn.Module):
    def __init__(self, hidden_size: int, layer_norm_eps: float):
        super().__init__()
        self.dense = RowParallelLinear(hidden_size, hidden_size, bias=True)
        self.LayerNorm = LayerNorm(hidden_size, eps=layer_norm_eps)

    def forward(self, hidden_states: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
        return dense_add_norm(self, hidden_states, input_tensor, native=False)

    def forward_native(self, hidden_states, input_tensor):
        return dense_add_norm(self, hidden_states, input_tensor, native=True)


class BertAttention(RecordsInit, nn.Module):
    def __init__(self, hidden_size: int, num_attention_heads: int, layer_norm_eps: float):
        super().__init__()
        self.self = BertSelfAttention(hidden_size, num_attention_heads)
        self.output = BertSelfOutput(hidden_size, layer_norm_eps)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.output(self.self(hidden_states), hidden_states)

    def forward_native(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.output.forward_native(self.self.forward_native(hidden_states), hidden_states)
