"""DeepSeek-V2's attention block from this tree's L1 modules: q projection (or the q LoRA pair),
latent projection + RMSNorm, YaRN rope (interleaved) on the rope parts, latent attention, o_proj.
The softmax scale carries YaRN's mscale squared, as HF's DeepseekV2Attention."""
import math

from torch import nn

from ..L1.deepseek_rotary_emb import DeepseekScalingRotaryEmbedding
from ..L1.linear import ReplicatedLinear, RowParallelLinear
from ..L1.mla_attention import MLAAttention
from ..L1.rms_norm import RMSNorm
from ..L1.rotary_emb import RotaryEmbedding


class DeepseekV2MLAAttention(nn.Module):
    def __init__(self, hidden_size, num_heads, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, q_lora_rank,
                 kv_lora_rank, rope_theta=10000, rope_scaling=None, max_position_embeddings=8192, rms_norm_eps=1e-6):
        super().__init__()
        self.h, self.nope, self.rope, self.rank, self.q_lora = (num_heads, qk_nope_head_dim, qk_rope_head_dim,
                                                                kv_lora_rank, q_lora_rank)
        qk = qk_nope_head_dim + qk_rope_head_dim
        if q_lora_rank is None:
            self.q_proj = ReplicatedLinear(hidden_size, num_heads * qk)
        else:
            self.q_a_proj = ReplicatedLinear(hidden_size, q_lora_rank)
            self.q_a_layernorm = RMSNorm(q_lora_rank, eps=rms_norm_eps)
            self.q_b_proj = ReplicatedLinear(q_lora_rank, num_heads * qk)
        self.kv_a_proj_with_mqa = ReplicatedLinear(hidden_size, kv_lora_rank + qk_rope_head_dim)
        self.kv_a_layernorm = RMSNorm(kv_lora_rank, eps=rms_norm_eps)
        scale = qk ** -0.5
        s = rope_scaling or {}
        if s.get("rope_type", s.get("type")) == "yarn":
            self.rotary_emb = DeepseekScalingRotaryEmbedding(
                qk_rope_head_dim, qk_rope_head_dim, s["original_max_position_embeddings"], rope_theta, False,
                s["factor"], beta_fast=s.get("beta_fast", 32), beta_slow=s.get("beta_slow", 1),
                mscale=s.get("mscale", 1), mscale_all_dim=s.get("mscale_all_dim", 0))
            if s.get("mscale_all_dim") and s["factor"] > 1:
                scale *= (0.1 * s["mscale_all_dim"] * math.log(s["factor"]) + 1.0) ** 2
        else:
            self.rotary_emb = RotaryEmbedding(qk_rope_head_dim, qk_rope_head_dim, max_position_embeddings,
                                              rope_theta, is_neox_style=False)
        self.mla_attn = MLAAttention(num_heads, scale, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, kv_lora_rank)
        self.o_proj = RowParallelLinear(num_heads * v_head_dim, hidden_size)

    def forward(self, positions, hidden_states):
        t = hidden_states.shape[0]
        if self.q_lora is None:
            q = self.q_proj(hidden_states)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))
        q = q.view(t, self.h, self.nope + self.rope)
        latent = self.kv_a_proj_with_mqa(hidden_states)
        kv_c = self.kv_a_layernorm(latent[:, : self.rank].contiguous())
        q_pe, k_pe = self.rotary_emb(positions, q[..., self.nope:].clone(), latent[:, None, self.rank:].clone())
        q = q.clone()
        q[..., self.nope:] = q_pe
        return self.o_proj(self.mla_attn(q.reshape(t, -1), kv_c, k_pe.reshape(t, self.rope)))
