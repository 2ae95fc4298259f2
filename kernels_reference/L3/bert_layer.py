"""BertLayer (vLLM): ``BertAttention``, then the MLP as BertIntermediate (dense + GELU) and
BertOutput (dense + ``LayerNorm(x + attention_output)``): post-norm, so the residual stream is the
previous LayerNorm's output and no residual is carried between layers.

``forward(hidden_states[T, hidden]) -> [T, hidden]`` over a packed batch (cu_seqlens in the forward
context).
"""
import torch
from torch import nn

from ..bert_config import BertArchConfig
from ..L1.gelu import GELU, gelu_approximation
from ..L1.layer_norm import LayerNorm
from ..L1.linear import ColumnParallelLinear, RowParallelLinear
from ..L2.bert_attention import BertAttention, dense_add_norm
from ..native import run
from ..records import RecordsInit



class BertIntermediate(RecordsInit, nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str):
        super().__init__()
        self.dense = ColumnParallelLinear(hidden_size, intermediate_size, bias=True)
        self.intermediate_act_fn = GELU(gelu_approximation(hidden_act))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.intermediate_act_fn(self.dense(hidden_states))

    def forward_native(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.intermediate_act_fn.forward_native(self.dense.forward_native(hidden_states))


class BertOutput(RecordsInit, nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, layer_norm_eps: float):
        super().__init__()
        self.dense = RowParallelLinear(intermediate_size, hidden_size, bias=True)
        self.LayerNorm = LayerNorm(hidden_size, eps=layer_norm_eps)

    def forward(self, hidden_states: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
        return dense_add_norm(self, hidden_states, input_tensor, native=False)

    def forward_native(self, hidden_states, input_tensor):
        return dense_add_norm(self, hidden_states, input_tensor, native=True)


class BertLayer(RecordsInit, nn.Module):
    def __init__(self, config: BertArchConfig):
        super().__init__()
        self.attention = BertAttention(config.hidden_size, config.num_attention_heads, config.layer_norm_eps)
        self.intermediate = BertIntermediate(config.hidden_size, config.intermediate_size, config.hidden_act)
        self.output = BertOutput(config.hidden_size, config.intermediate_size, config.layer_norm_eps)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._forward(hidden_states, native=False)

    def forward_native(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._forward(hidden_states, native=True)

    def _forward(self, hidden_states, native):
        attention_output = run(self.attention, native, hidden_states)
        return run(self.output, native, run(self.intermediate, native, attention_output), attention_output)
