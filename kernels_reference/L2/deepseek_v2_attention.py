"""DeepseekV2MLAAttention (vLLM's name): DeepSeek-V2's attention block around multi-head latent attention.

``forward(positions[T], hidden_states[T, hidden]) -> [T, hidden]``:

    q            = q_proj(h)                          or q_b_proj(q_a_layernorm(q_a_proj(h)))
    [c | k_pe]   = kv_a_proj_with_mqa(h)              the latent (kv_lora_rank) and one rope key
    c            = kv_a_layernorm(c)
    q[.., nope:], k_pe = rotary_emb(positions, q[.., nope:], k_pe)    YaRN, interleaved (GPT-J) style
    out          = o_proj(mla_attn(q, c, k_pe))       mla_attn owns kv_b_proj and the latent cache

Softmax scale as HF and vLLM: ``qk_head_dim ** -0.5``, times ``mscale ** 2`` with
``mscale = 0.1 * mscale_all_dim * ln(factor) + 1`` when YaRN's ``mscale_all_dim`` is set (1.59 for
DeepSeek-V2-Lite: the temperature YaRN's cos/sin would otherwise carry, moved into the scale).

Checkpoint names: HF's ``self_attn.*`` map onto this module as in :data:`HF_NAME_MAP` (only
``kv_b_proj`` moves, into ``mla_attn``); :meth:`load_hf_weights` applies it to one layer's tensors.
"""
from typing import Dict, Iterable, Optional, Tuple

import torch
from torch import nn

from ..L1.deepseek_rotary_emb import DeepseekScalingRotaryEmbedding, yarn_get_mscale
from ..L1.linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear
from ..L1.mla_attention import MLAAttention
from ..L1.rms_norm import RMSNorm
from ..L1.rotary_emb import RotaryEmbedding
from ..native import run
from ..records import RecordsInit

# HF parameter name (under ``model.layers.<i>.self_attn.``) -> ours (under the same layer's module).
HF_NAME_MAP = {
    "q_proj.weight": "q_proj.weight",
    "q_a_proj.weight": "q_a_proj.weight",
    "q_a_layernorm.weight": "q_a_layernorm.weight",
    "q_b_proj.weight": "q_b_proj.weight",
    "kv_a_proj_with_mqa.weight": "kv_a_proj_with_mqa.weight",
    "kv_a_layernorm.weight": "kv_a_layernorm.weight",
    "kv_b_proj.weight": "mla_attn.kv_b_proj.weight",
    "o_proj.weight": "o_proj.weight",
}


def rope_kind(rope_scaling: Optional[dict]) -> str:
    if not rope_scaling:
        return "default"
    return rope_scaling.get("rope_type", rope_scaling.get("type", "default"))


def softmax_scale(qk_head_dim: int, rope_scaling: Optional[dict]) -> float:
    scale = qk_head_dim ** -0.5
    if rope_kind(rope_scaling) == "yarn" and rope_scaling.get("mscale_all_dim"):
        mscale = yarn_get_mscale(rope_scaling["factor"], float(rope_scaling["mscale_all_dim"]))
        scale = scale * mscale * mscale
    return scale


def deepseek_rope(rope_dim: int, max_position_embeddings: int, rope_theta: float,
                  rope_scaling: Optional[dict]) -> RotaryEmbedding:
    """DeepSeek's rope module: interleaved style; YaRN built over the *original* context as vLLM does."""
    kind = rope_kind(rope_scaling)
    if kind == "yarn":
        extra = {k: rope_scaling[k] for k in ("extrapolation_factor", "attn_factor", "beta_fast", "beta_slow",
                                              "mscale", "mscale_all_dim") if k in rope_scaling}
        return DeepseekScalingRotaryEmbedding(
            rope_dim, rope_dim, rope_scaling["original_max_position_embeddings"], rope_theta,
            is_neox_style=False, scaling_factor=rope_scaling["factor"], **extra)
    return RotaryEmbedding(rope_dim, rope_dim, max_position_embeddings, rope_theta, is_neox_style=False,
                           rope_scaling=rope_scaling if kind != "default" else None)


class DeepseekV2MLAAttention(RecordsInit, nn.Module):
    def __init__(self, hidden_size: int, num_heads: int, qk_nope_head_dim: int, qk_rope_head_dim: int,
                 v_head_dim: int, q_lora_rank: Optional[int], kv_lora_rank: int, rope_theta: float = 10000,
                 rope_scaling: Optional[dict] = None, max_position_embeddings: int = 8192,
                 rms_norm_eps: float = 1e-6):
        super().__init__()
        self.num_heads = num_heads
        self.qk_nope_head_dim, self.qk_rope_head_dim = qk_nope_head_dim, qk_rope_head_dim
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        self.v_head_dim, self.q_lora_rank, self.kv_lora_rank = v_head_dim, q_lora_rank, kv_lora_rank
        if q_lora_rank is None:
            self.q_proj = ColumnParallelLinear(hidden_size, num_heads * self.qk_head_dim)
        else:
            self.q_a_proj = ReplicatedLinear(hidden_size, q_lora_rank)
            self.q_a_layernorm = RMSNorm(q_lora_rank, eps=rms_norm_eps)
            self.q_b_proj = ColumnParallelLinear(q_lora_rank, num_heads * self.qk_head_dim)
        self.kv_a_proj_with_mqa = ReplicatedLinear(hidden_size, kv_lora_rank + qk_rope_head_dim)
        self.kv_a_layernorm = RMSNorm(kv_lora_rank, eps=rms_norm_eps)
        self.rotary_emb = deepseek_rope(qk_rope_head_dim, max_position_embeddings, rope_theta, rope_scaling)
        self.scaling = softmax_scale(self.qk_head_dim, rope_scaling)
        self.mla_attn = MLAAttention(num_heads, self.scaling, qk_nope_head_dim, qk_rope_head_dim, v_head_dim,
                                     kv_lora_rank)
        self.o_proj = RowParallelLinear(num_heads * v_head_dim, hidden_size)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._forward(positions, hidden_states, native=False)

    def forward_native(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        return self._forward(positions, hidden_states, native=True)

    def _forward(self, positions, hidden_states, native):
        t = hidden_states.shape[0]
        if self.q_lora_rank is None:
            q = run(self.q_proj, native, hidden_states)
        else:
            q = run(self.q_b_proj, native, run(self.q_a_layernorm, native, run(self.q_a_proj, native, hidden_states)))
        q = q.view(t, self.num_heads, self.qk_head_dim)
        latent = run(self.kv_a_proj_with_mqa, native, hidden_states)
        kv_c, k_pe = latent.split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        kv_c_normed = run(self.kv_a_layernorm, native, kv_c)
        # The rope part of every head, a strided view of q; the fast path rotates it in place.
        q_pe = q[..., self.qk_nope_head_dim:]
        q_pe_rotated, k_pe = run(self.rotary_emb, native, positions, q_pe, k_pe.unsqueeze(1))
        # Identity, not data_ptr: Dynamo traces an ``is`` test (fullgraph), not a pointer comparison.
        # The rotary fast path returns q_pe itself when it rotated in place; a copy of the same
        # memory onto itself (another view object of it) would be harmless.
        if q_pe_rotated is not q_pe:
            q_pe.copy_(q_pe_rotated)
        out = run(self.mla_attn, native, q.view(t, -1), kv_c_normed, k_pe.reshape(t, self.qk_rope_head_dim))
        return run(self.o_proj, native, out)

    # ---- checkpoint -----------------------------------------------------------------------------------
    def load_hf_weights(self, weights: Iterable[Tuple[str, torch.Tensor]], prefix: str = "") -> None:
        """Copy one layer's HF tensors (names ``<prefix>q_proj.weight`` ...; ``prefix`` e.g.
        ``model.layers.0.self_attn.``) into this module through :data:`HF_NAME_MAP`, strictly: every
        parameter must be given once with its shape, and no other name under the prefix."""
        params: Dict[str, nn.Parameter] = dict(self.named_parameters())
        seen = set()
        for name, tensor in weights:
            if not name.startswith(prefix):
                continue
            ours = HF_NAME_MAP.get(name[len(prefix):])
            if ours is None or ours not in params:
                raise KeyError(f"unexpected checkpoint tensor {name!r} for {type(self).__name__}")
            if tuple(tensor.shape) != tuple(params[ours].shape):
                raise ValueError(f"{name}: shape {tuple(tensor.shape)} does not match {ours} {tuple(params[ours].shape)}")
            with torch.no_grad():
                params[ours].copy_(tensor)
            seen.add(ours)
        missing = sorted(set(params) - seen)
        if missing:
            raise KeyError(f"checkpoint is missing {missing} for {type(self).__name__}")
