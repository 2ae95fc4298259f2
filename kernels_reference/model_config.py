"""The architecture facts a Llama-family model needs, read from an HF config (object or dict).

Llama, Mistral, Qwen2 and Qwen3 differ only by switches here: qkv bias (Qwen2, or Llama's
``attention_bias``), per-head q/k norm (Qwen3), an explicit head_dim, rope scaling, tied embeddings.
A new HF decoder architecture of the same shape is added by mapping its config onto these fields.

Mixtral and Qwen3-MoE are Llama attention plus a mixture-of-experts MLP: the MoE fields below
(zero experts = a dense model). :class:`DeepseekMoEConfig` holds DeepSeek-V2's MoE block facts
(its MLA attention is another module's business); :class:`DeepseekV2ArchConfig` is the whole
DeepSeek-V2 model: MLA attention dims, the dense MLP of the first layers, and that MoE block.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Tuple

MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
               "qwen3": "Qwen3ForCausalLM", "mixtral": "MixtralForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
               "deepseek_v2": "DeepseekV2ForCausalLM", "mamba2": "Mamba2ForCausalLM",
               "qwen3_next": "Qwen3NextForCausalLM"}
QKV_BIAS = {"Qwen2ForCausalLM"}
QK_NORM = {"Qwen3ForCausalLM", "Qwen3MoeForCausalLM"}


def architecture_of(config: Any) -> str:
    """The HF architecture name of a config (object or dict): ``architectures[0]``, else by model type."""
    get = _getter(config)
    if isinstance(config, (LlamaArchConfig, DeepseekV2ArchConfig)):
        return config.architecture
    return (get("architectures") or [MODEL_TYPES.get(get("model_type"), "LlamaForCausalLM")])[0]


def rope_fields(get) -> Tuple[float, Optional[dict]]:
    """(rope_theta, rope_scaling or None) from transformers 4 (``rope_theta`` / ``rope_scaling``)
    or 5 (both inside ``rope_parameters``) config fields."""
    rope = dict(get("rope_parameters") or {})
    theta = get("rope_theta") or rope.get("rope_theta") or 10000.0
    scaling = get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
    if scaling:
        scaling = {k: v for k, v in dict(scaling).items() if k != "rope_theta"}
    return float(theta), scaling or None


def _getter(config: Any):
    return (lambda k, d=None: config.get(k, d)) if isinstance(config, dict) else \
        (lambda k, d=None: getattr(config, k, d))


@dataclasses.dataclass(frozen=True)
class LlamaArchConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    rope_scaling: Optional[dict] = None
    qkv_bias: bool = False
    qk_norm: bool = False
    tie_word_embeddings: bool = False
    hidden_act: str = "silu"
    architecture: str = "LlamaForCausalLM"
    # Mixture of experts (Mixtral: every layer; Qwen3-MoE: every decoder_sparse_step-th layer not
    # in mlp_only_layers). num_experts == 0: a dense model.
    num_experts: int = 0
    top_k: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: Tuple[int, ...] = ()

    def is_sparse_layer(self, layer_idx: int) -> bool:
        """Whether layer ``layer_idx`` has the MoE block (HF's and vLLM's rule for Qwen3-MoE)."""
        return (self.num_experts > 0 and layer_idx not in self.mlp_only_layers
                and (layer_idx + 1) % self.decoder_sparse_step == 0)

    @staticmethod
    def from_hf(config: Any) -> "LlamaArchConfig":
        get = _getter(config)
        arch = architecture_of(config)
        heads = get("num_attention_heads")
        theta, scaling = rope_fields(get)
        return LlamaArchConfig(
            vocab_size=get("vocab_size"), hidden_size=get("hidden_size"),
            intermediate_size=get("intermediate_size"), num_hidden_layers=get("num_hidden_layers"),
            num_attention_heads=heads, num_key_value_heads=get("num_key_value_heads") or heads,
            head_dim=get("head_dim") or get("hidden_size") // heads, rms_norm_eps=get("rms_norm_eps"),
            rope_theta=theta, max_position_embeddings=get("max_position_embeddings"),
            rope_scaling=scaling,
            qkv_bias=arch in QKV_BIAS or bool(get("attention_bias", False)),
            qk_norm=arch in QK_NORM or bool(get("qk_norm", False)),
            tie_word_embeddings=bool(get("tie_word_embeddings", False)),
            hidden_act=get("hidden_act", "silu"), architecture=arch, **_moe_fields(get, arch))


def _moe_fields(get, arch: str) -> dict:
    if arch == "MixtralForCausalLM":  # every layer sparse; the experts are intermediate_size wide
        return dict(num_experts=get("num_local_experts"), top_k=get("num_experts_per_tok"),
                    moe_intermediate_size=get("intermediate_size"), norm_topk_prob=True)
    if arch == "Qwen3MoeForCausalLM":
        return dict(num_experts=get("num_experts"), top_k=get("num_experts_per_tok"),
                    moe_intermediate_size=get("moe_intermediate_size"),
                    norm_topk_prob=bool(get("norm_topk_prob", False)),
                    decoder_sparse_step=get("decoder_sparse_step", 1) or 1,
                    mlp_only_layers=tuple(get("mlp_only_layers") or ()))
    return {}


@dataclasses.dataclass(frozen=True)
class DeepseekMoEConfig:
    """DeepSeek-V2's MoE block: routed experts with greedy softmax top-k, shared experts beside them.

    Layer ``i`` is sparse when ``i >= first_k_dense_replace and i % moe_layer_freq == 0``. Only the
    ``greedy`` top-k with softmax scoring (DeepSeek-V2 and V2-Lite) is supported; other methods
    (``group_limited_greedy``, V3's ``noaux_tc``) and scoring functions are refused by name.
    """

    hidden_size: int
    moe_intermediate_size: int
    n_routed_experts: int
    num_experts_per_tok: int
    n_shared_experts: int
    first_k_dense_replace: int = 0
    moe_layer_freq: int = 1
    routed_scaling_factor: float = 1.0
    norm_topk_prob: bool = False
    hidden_act: str = "silu"

    def is_sparse_layer(self, layer_idx: int) -> bool:
        return layer_idx >= self.first_k_dense_replace and layer_idx % self.moe_layer_freq == 0

    def block_args(self) -> dict:
        """The constructor arguments of ``L2.deepseek_v2_moe.DeepseekV2MoE``."""
        return dict(hidden_size=self.hidden_size, moe_intermediate_size=self.moe_intermediate_size,
                    n_routed_experts=self.n_routed_experts, num_experts_per_tok=self.num_experts_per_tok,
                    n_shared_experts=self.n_shared_experts, norm_topk_prob=self.norm_topk_prob,
                    routed_scaling_factor=self.routed_scaling_factor)

    @staticmethod
    def from_hf(config: Any) -> "DeepseekMoEConfig":
        get = _getter(config)
        method = get("topk_method", "greedy") or "greedy"
        if method != "greedy":
            raise NotImplementedError(f"topk_method {method!r}: only 'greedy' routing is supported")
        scoring = get("scoring_func", "softmax") or "softmax"
        if scoring != "softmax":
            raise NotImplementedError(f"scoring_func {scoring!r}: only 'softmax' routing is supported")
        return DeepseekMoEConfig(
            hidden_size=get("hidden_size"), moe_intermediate_size=get("moe_intermediate_size"),
            n_routed_experts=get("n_routed_experts") or get("num_experts"),
            num_experts_per_tok=get("num_experts_per_tok"), n_shared_experts=get("n_shared_experts") or 0,
            first_k_dense_replace=get("first_k_dense_replace", 0) or 0, moe_layer_freq=get("moe_layer_freq", 1) or 1,
            routed_scaling_factor=float(get("routed_scaling_factor", 1.0) or 1.0),
            norm_topk_prob=bool(get("norm_topk_prob", False)), hidden_act=get("hidden_act", "silu"))


@dataclasses.dataclass(frozen=True)
class DeepseekV2ArchConfig:
    """DeepSeek-V2 / V2-Lite as a whole model: multi-head latent attention (``q_lora_rank`` None:
    a plain q projection, as V2-Lite), a dense MLP ``intermediate_size`` wide on the layers before
    ``moe.first_k_dense_replace`` (and off the ``moe_layer_freq`` grid), the MoE block elsewhere.
    The field names the engine and the tasks read (vocab_size, hidden_size, num_hidden_layers,
    max_position_embeddings, rms_norm_eps, tie_word_embeddings, architecture) are Llama's."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    q_lora_rank: Optional[int]
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    moe: DeepseekMoEConfig
    rope_scaling: Optional[dict] = None
    tie_word_embeddings: bool = False
    hidden_act: str = "silu"
    architecture: str = "DeepseekV2ForCausalLM"

    def is_sparse_layer(self, layer_idx: int) -> bool:
        return self.moe.is_sparse_layer(layer_idx)

    def attention_args(self) -> dict:
        """The constructor arguments of ``L2.deepseek_v2_attention.DeepseekV2MLAAttention``."""
        return dict(hidden_size=self.hidden_size, num_heads=self.num_attention_heads,
                    qk_nope_head_dim=self.qk_nope_head_dim, qk_rope_head_dim=self.qk_rope_head_dim,
                    v_head_dim=self.v_head_dim, q_lora_rank=self.q_lora_rank, kv_lora_rank=self.kv_lora_rank,
                    rope_theta=self.rope_theta, rope_scaling=self.rope_scaling,
                    max_position_embeddings=self.max_position_embeddings, rms_norm_eps=self.rms_norm_eps)

    @staticmethod
    def from_hf(config: Any) -> "DeepseekV2ArchConfig":
        if isinstance(config, DeepseekV2ArchConfig):
            return config
        get = _getter(config)
        theta, scaling = rope_fields(get)
        return DeepseekV2ArchConfig(
            vocab_size=get("vocab_size"), hidden_size=get("hidden_size"),
            intermediate_size=get("intermediate_size"), num_hidden_layers=get("num_hidden_layers"),
            num_attention_heads=get("num_attention_heads"), q_lora_rank=get("q_lora_rank"),
            kv_lora_rank=get("kv_lora_rank"), qk_nope_head_dim=get("qk_nope_head_dim"),
            qk_rope_head_dim=get("qk_rope_head_dim"), v_head_dim=get("v_head_dim"),
            rms_norm_eps=get("rms_norm_eps"), rope_theta=theta,
            max_position_embeddings=get("max_position_embeddings"), moe=DeepseekMoEConfig.from_hf(config),
            rope_scaling=scaling, tie_word_embeddings=bool(get("tie_word_embeddings", False)),
            hidden_act=get("hidden_act", "silu"), architecture=architecture_of(config))
