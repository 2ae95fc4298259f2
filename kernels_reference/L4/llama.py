"""LlamaForCausalLM (vLLM) and its Qwen2 / Qwen3 / Mistral variants (config switches).

``forward(input_ids[T], positions[T]) -> hidden_states[T, hidden]`` over a packed batch whose
attention metadata is in the forward context; ``compute_logits(hidden_states) -> [T, vocab]``.
``load_weights`` takes HF checkpoint names (safetensors or an HF state_dict) and packs q/k/v into
``qkv_proj`` and gate/up into ``gate_up_proj``; the MoE models (``L4/mixtral.py``,
``L4/qwen3_moe.py``) subclass these classes and reuse the loader, which also stacks experts, from
per-expert Hub names (``experts.{e}.w1`` / ``gate_proj`` ...) or transformers 5's fused 3-D
``experts.gate_up_proj`` / ``experts.down_proj``, into FusedMoE's ``w13_weight`` / ``w2_weight``.
"""
import importlib
from typing import Iterable, Optional, Tuple

import torch
from torch import nn

from ..checkpoint import load_checkpoint
from ..L1.rms_norm import RMSNorm
from ..L1.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from ..L3.llama_decoder_layer import LlamaDecoderLayer
from ..model_config import LlamaArchConfig, architecture_of
from ..native import run
from ..records import RecordsInit

class LlamaModel(RecordsInit, nn.Module):
    def __init__(self, config: LlamaArchConfig):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(self.make_layer(config, i) for i in range(config.num_hidden_layers))
        self.norm = self.make_norm(config)

    def make_layer(self, config: LlamaArchConfig, layer_idx: int) -> nn.Module:
        """The decoder layer at ``layer_idx`` (subclasses: the MoE models' layers)."""
        return LlamaDecoderLayer(config)

    def make_norm(self, config: LlamaArchConfig) -> nn.Module:
        """The final norm, fed the last layer's residual (subclasses: Qwen3-Next's zero-centred one)."""
        return RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, input_ids, positions):
        return self._forward(input_ids, positions, native=False)

    def forward_native(self, input_ids, positions):
        return self._forward(input_ids, positions, native=True)

    def _forward(self, input_ids, positions, native):
        hidden_states, residual = run(self.embed_tokens, native, input_ids), None
        for layer in self.layers:
            hidden_states, residual = run(layer, native, positions, hidden_states, residual)
        hidden_states, _ = run(self.norm, native, hidden_states, residual)
        return hidden_states


class LlamaForCausalLM(RecordsInit, nn.Module):
    model_class = LlamaModel  # the decoder stack (subclasses of LlamaModel for the MoE models)
    # (checkpoint fragment, ours) renames applied before placement, e.g. transformers 5 calls
    # Mixtral's block ``mlp`` where vLLM and the Hub checkpoints say ``block_sparse_moe``.
    checkpoint_renames: Tuple[Tuple[str, str], ...] = ()

    config_class = LlamaArchConfig  # reads an HF config (object or dict) into ours

    def __init__(self, config: LlamaArchConfig):
        super().__init__()
        if not isinstance(config, self.config_class):
            config = self.config_class.from_hf(config)
        self.config = config
        self.model = self.model_class(config)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    def forward_native(self, input_ids, positions):
        return self.model.forward_native(input_ids, positions)

    def compute_logits(self, hidden_states: torch.Tensor, native: bool = False) -> torch.Tensor:
        return run(self.lm_head, native, hidden_states)

    # ---- KV cache -----------------------------------------------------------------------------
    def allocate_kv_cache(self, num_blocks: int, block_size: int, dtype=None, device=None) -> None:
        weight = self.lm_head.weight
        dtype, device = dtype or weight.dtype, device or weight.device
        for attn in self.attention_layers():
            attn.kv_cache = self.new_cache(num_blocks, block_size, dtype, device, getattr(attn, "num_kv_heads", None))

    def attention_layers(self):
        """The modules that own a layer's KV cache, in layer order."""
        return [layer.self_attn.attn for layer in self.model.layers]

    def new_cache(self, num_blocks: int, block_size: int, dtype, device, kv_heads=None):
        """One layer's cache: a (key, value) pair of [blocks, block_size, kv heads, head_dim]; the
        KV heads are the layer's own (this rank's under tensor parallelism), else the config's."""
        c = self.config
        shape = (num_blocks, block_size, kv_heads or c.num_key_value_heads, c.head_dim)
        return (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))

    # ---- weights ------------------------------------------------------------------------------
    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> None:
        """HF-named tensors into place (see :mod:`kernels_reference.checkpoint`)."""
        skip = ("lm_head.weight",) if self.config.tie_word_embeddings else ()
        load_checkpoint(self, weights, renames=self.checkpoint_renames, skip=skip)

    def load_safetensors(self, paths: Iterable[str]) -> None:
        """All shards of a checkpoint in one pass (completeness is checked over the whole set)."""
        from safetensors.torch import load_file

        self.load_weights(item for path in paths for item in load_file(path).items())


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Qwen2 / Qwen2.5: Llama with biases on q, k and v (from the config's architecture)."""


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Qwen3: Llama with per-head q/k RMSNorm and an explicit head_dim."""


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral-7B-v0.3: the Llama architecture (no sliding window in v0.3)."""


ARCHITECTURES = {cls.__name__: cls for cls in
                 (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM)}


@torch.no_grad()
def init_random_weights(model: nn.Module, generator: Optional[torch.Generator] = None) -> nn.Module:
    """Random weights at a trained network's scale, for models built from a config alone: every
    matrix (and each expert's) N(0, 1/fan_in) (unit-size activations stay unit-size through the layers), every vector
    (the norm weights) 1 + N(0, 0.01). One float32 draw per parameter, in ``parameters()`` order.
    Then each module with an ``init_random_parameters(generator)`` redraws the parameters that rule
    does not fit (a zero-centred norm's weight, a state-space layer's decay rates), in module order."""
    for p in model.parameters():  # matrices and stacked experts [E, out, in] alike: fan_in is last
        noise = torch.randn(p.shape, generator=generator, device=p.device)
        p.copy_(noise * p.shape[-1] ** -0.5 if p.dim() >= 2 else 1 + 0.1 * noise)
    for module in model.modules():
        redraw = getattr(module, "init_random_parameters", None)
        if redraw is not None:
            redraw(generator)
    return model


# Architectures served from other modules of this package (imported when asked for: they import
# this one).
LAZY_ARCHITECTURES = {"MixtralForCausalLM": "mixtral", "Qwen3MoeForCausalLM": "qwen3_moe",
                      "DeepseekV2ForCausalLM": "deepseek_v2", "Mamba2ForCausalLM": "mamba2",
                      "Qwen3NextForCausalLM": "qwen3_next"}


def model_class(architecture: str) -> type:
    if architecture in LAZY_ARCHITECTURES:
        module = importlib.import_module(f"{__package__}.{LAZY_ARCHITECTURES[architecture]}")
        return getattr(module, architecture)
    return ARCHITECTURES.get(architecture, LlamaForCausalLM)


def model_for(config) -> LlamaForCausalLM:
    cls = model_class(architecture_of(config))
    return cls(cls.config_class.from_hf(config))
