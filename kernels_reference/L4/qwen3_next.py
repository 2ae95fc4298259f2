"""Qwen3NextForCausalLM (vLLM): embedding, the hybrid stack of Qwen3NextDecoderLayer (three gated
DeltaNet layers, then one gated full-attention layer, repeated: ``config.layer_types``), the final
zero-centred norm and the LM head; the interface of LlamaForCausalLM (forward, compute_logits,
allocate_kv_cache, load_weights, load_safetensors).

Two kinds of per-sequence memory, both bound to the layers before a step runs:

* a paged KV cache per full-attention layer (``allocate_kv_cache``: [blocks, block_size, kv heads,
  head_dim] pairs bound to ``self_attn.attn.kv_cache``), addressed by the metadata's block tables;
* two state pools per linear-attention layer (``allocate_state_pools``: ``conv_states [slots,
  K - 1, conv_dim]`` in the activation dtype and ``ssm_states [slots, Hv, K, V]`` in float32, bound
  to ``linear_attn.state_cache``), addressed by the metadata's ``state_slots``; a sequence keeps
  its slot from its first prefill chunk to its last decode step, and a fresh sequence
  (``has_initial_state`` False) ignores what its slot held.

Checkpoints: HF names through the shared loader: ``q_proj`` / ``k_proj`` / ``v_proj`` packed into
``qkv_proj`` (the q shard is twice as wide: each head's query and its gate), experts as the Hub's
``mlp.experts.{e}.gate_proj/up_proj/down_proj`` or transformers 5's fused ``mlp.experts.gate_up_proj``
/ ``down_proj`` into FusedMoE's stacks, the shared expert's gate/up into its ``gate_up_proj``; the
linear-attention tensors (``in_proj_qkvz``, ``in_proj_ba``, ``conv1d``, ``A_log``, ``dt_bias``,
``norm``) load as stored. The multi-token-prediction head (``mtp.*``) is a draft model's, not
this one's: skipped, as vLLM skips it.
"""
from typing import Iterable, List, Tuple

import torch
from torch import nn

from ..L1.gemma_rms_norm import GemmaRMSNorm
from ..L3.qwen3_next_decoder_layer import Qwen3NextDecoderLayer
from ..qwen3_next_config import FULL, LINEAR, Qwen3NextArchConfig
from ..state_pools import bind_state_pools
from .llama import LlamaForCausalLM, LlamaModel


class Qwen3NextModel(LlamaModel):
    """LlamaModel's embedding, layers and fused-residual final norm, with Qwen3-Next's layers (each
    a gated DeltaNet or gated attention by ``layer_types``) and zero-centred final norm."""

    def make_layer(self, config: Qwen3NextArchConfig, layer_idx: int) -> nn.Module:
        return Qwen3NextDecoderLayer(config, layer_idx)

    def make_norm(self, config: Qwen3NextArchConfig) -> nn.Module:
        return GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)


class Qwen3NextForCausalLM(LlamaForCausalLM):
    model_class = Qwen3NextModel
    config_class = Qwen3NextArchConfig

    # ---- KV caches (full-attention layers) -------------------------------------------------------
    def attention_layers(self) -> List[nn.Module]:
        return [layer.self_attn.attn for layer in self.model.layers if layer.layer_type == FULL]

    # ---- recurrent-state pools (linear-attention layers) -----------------------------------------
    def state_layers(self) -> List[nn.Module]:
        """The modules that own a layer's state pools, in layer order."""
        return [layer.linear_attn for layer in self.model.layers if layer.layer_type == LINEAR]

    def state_shapes(self) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
        """(conv window, recurrent state) of one slot of one linear-attention layer."""
        return self.config.conv_state_shape(), self.config.ssm_state_shape()

    def allocate_state_pools(self, num_slots: int, dtype=None, device=None) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        """Make every linear-attention layer's (conv_states, ssm_states) pools of ``num_slots`` slots
        and bind them (the same call as Mamba2ForCausalLM's): the conv windows in ``dtype`` (default:
        the model's), the recurrent states in float32 (they accumulate over the whole sequence; vLLM
        keeps them in float32 too). Returned in layer order."""
        weight = self.lm_head.weight
        dtype, device = dtype or weight.dtype, device or weight.device
        return bind_state_pools(self.state_layers(), num_slots, *self.state_shapes(), dtype, device)

    # ---- weights ------------------------------------------------------------------------------
    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> None:
        super().load_weights((name, tensor) for name, tensor in weights if not name.startswith("mtp."))
