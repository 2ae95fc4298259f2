"""Shared shape of the tasks that attend over DeepSeek's paged *latent* cache (L1 MLAAttention, L2
DeepseekV2MLAAttention): the batches, metadata and block shuffling of :mod:`tasks.paged`, with one
cache per layer, ``kv_cache_<i>`` [num_blocks, block_size, kv_lora_rank + rope], as an input whose
state after the call is an output (the layer must store the step's latent rows at the slot mapping).

Profiles: the full one is DeepSeek-V2-Lite as served (16 heads) on the steps of its captured workload
(``PagedTask.captured_batch_cases``: representative steps weighted by their share, plus the
decode-B1-C8192 and B32-C2048 bandwidth shapes; the hand-picked batches of ``tasks.paged`` where no
capture exists); the CPU one keeps the real head dims
(nope 128, rope 64, v 128, latent 512) with 2 heads and short contexts, and mixes decode, fresh
prefill and chunked prefill in one batch.
"""
from typing import Dict, List, Tuple

import torch

from fk_pytest import Case
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.forward_context import AttentionMetadata
from kernels_reference.L2.deepseek_v2_attention import softmax_scale

from .configs import load_config
from .paged import BATCHES, BLOCK_SIZE, PagedTask
from .workload import activations, call_with_metadata, model_dtype

MLA_MODEL = "deepseek-v2-lite"
CPU_HEADS = 2
MLA_BATCHES = {
    "cpu": dict(BATCHES["cpu"], **{"mixed-B3": ([30, 0, 12], [1, 5, 1])}),
    "full": {k: v for k, v in BATCHES["full"].items()},
}


def mla_dims(model: str, profile: str) -> Dict:
    cfg = load_config(model)
    return dict(heads=CPU_HEADS if profile == "cpu" else cfg["num_attention_heads"],
                nope=cfg["qk_nope_head_dim"], rope=cfg["qk_rope_head_dim"], v=cfg["v_head_dim"],
                rank=cfg["kv_lora_rank"], q_lora_rank=cfg["q_lora_rank"], hidden=cfg["hidden_size"])


class MLAPagedTask(PagedTask):
    family = "attention"
    tp_degrees = ()  # MLA's latent cache and projections do not shard yet: no tensor-parallel cases
    models = {"cpu": (MLA_MODEL,), "full": (MLA_MODEL,)}

    def cases(self, profile) -> List[Case]:
        if profile == "full":  # the captured DeepSeek-V2-Lite steps, with their step shares
            return self.captured_batch_cases(profile, lambda model: mla_dims(model, profile))
        out = []
        for model in self.models[profile]:
            dt = model_dtype(model)
            for name, (ctx, q) in MLA_BATCHES[profile].items():
                params = dict(mla_dims(model, profile), context=ctx, query=q, model=model)
                out.append(Case(f"{model}-{name}-{DTYPE_NAMES[dt]}", dt, model=model, params=params))
        return out

    def scale(self, case) -> float:
        return softmax_scale(case["nope"] + case["rope"], load_config(case["model"]).get("rope_scaling"))

    # ---- inputs ---------------------------------------------------------------------------------
    def metadata_and_caches(self, case, gen, device) -> Dict:
        ctx, q = case["context"], case["query"]
        need = [-(-(c + n) // BLOCK_SIZE) for c, n in zip(ctx, q)]
        order = torch.randperm(sum(need) + 2, generator=gen, device=device).tolist()
        tables, at = [], 0
        for n in need:
            tables.append(order[at: at + n])
            at += n
        out = {"metadata": AttentionMetadata.build(ctx, q, BLOCK_SIZE, device=device, block_tables=tables)}
        for i in range(self.layers):
            out[f"kv_cache_{i}"] = activations((len(order), BLOCK_SIZE, case["rank"] + case["rope"]), gen,
                                               device, case.dtype)
        return out

    def cache_names(self):
        return tuple(f"kv_cache_{i}" for i in range(self.layers))

    def call(self, module, inputs, method=None):
        layers = [m for m in module.modules() if hasattr(m, "kv_cache")] or [module]
        for i, layer in enumerate(layers):
            layer.kv_cache = inputs[f"kv_cache_{i}"]
        return call_with_metadata(module, inputs, method, exclude=self.cache_names())

    # ---- cost ---------------------------------------------------------------------------------------
    def attention_io(self, case) -> int:
        """The latent cache read once, the step's rows written, kv_b_proj read once, q in, out."""
        h, es = case["heads"], torch.finfo(case.dtype).bits // 8
        t = sum(case["query"])
        width = case["rank"] + case["rope"]
        cache_read = sum(c + n for c, n in zip(case["context"], case["query"])) * width
        weights = h * (case["nope"] + case["v"]) * case["rank"]
        activations_io = t * (h * (case["nope"] + case["rope"]) + 2 * width + h * case["v"])
        return (cache_read + weights + activations_io) * es * self.layers

    def attention_flops(self, case) -> int:
        """Decode sequences in the absorbed form, prefill ones expanded (what the reference runs)."""
        h, r, rope, nope, v = case["heads"], case["rank"], case["rope"], case["nope"], case["v"]
        total = 0
        for c, n in zip(case["context"], case["query"]):
            if n == 1:
                total += 2 * h * (nope * r + (c + 1) * (2 * r + rope) + r * v)
            else:
                pairs = n * (c + (n + 1) / 2)
                total += 2 * h * ((c + n) * r * (nope + v) + pairs * (nope + rope + v))
        return int(total) * self.layers


# ---- L3 / L4: DeepSeek-V2's decoder layer and model over the paged latent cache ---------------------
# CPU profile: the real E = 64, k = 6 and 2 shared experts with the widths of ``tasks.moe`` CPU_CUT
# (hidden 256, experts 64 wide, the dense MLP 128) and MLA cut to 4 heads of nope 32 + rope 16,
# v 32, a 64-wide latent: a float64 truth of the whole layer stays a fraction of a second.
CPU_MLA_CUT = dict(num_attention_heads=4, num_key_value_heads=4, qk_nope_head_dim=32, qk_rope_head_dim=16,
                   v_head_dim=32, kv_lora_rank=64)
MOE_LAYER = 1  # the L3 task's layer: every DeepSeek-V2 layer from 1 on is a MoE layer


def deepseek_arch_config(profile: str, layers: int = 1, vocab_shard: int = 1, model: str = MLA_MODEL):
    """DeepseekV2ArchConfig of the model (on the CPU profile cut as above), ``layers`` deep."""
    from kernels_reference.model_config import DeepseekV2ArchConfig

    from .moe import cut_config

    cfg = cut_config(model, profile)
    if profile == "cpu":
        cfg.update(CPU_MLA_CUT)
    cfg["num_hidden_layers"] = layers
    cfg["vocab_size"] = cfg["vocab_size"] // vocab_shard
    return DeepseekV2ArchConfig.from_hf(cfg)


def deepseek_dims(profile: str, model: str = MLA_MODEL) -> Dict:
    """The case parameters MLAPagedTask reads (heads and MLA widths), from the (cut) config."""
    c = deepseek_arch_config(profile, model=model)
    return dict(heads=c.num_attention_heads, nope=c.qk_nope_head_dim, rope=c.qk_rope_head_dim, v=c.v_head_dim,
                rank=c.kv_lora_rank, q_lora_rank=c.q_lora_rank, hidden=c.hidden_size, profile=profile)


def deepseek_weight_elems(c, layer_indices) -> Tuple[int, int]:
    """(weights read, weights used per token) in elements over the given layers: attention
    projections (``kv_b_proj`` is in ``attention_io``), then the dense MLP or the MoE block (all E
    experts read, k used per token, the router and the shared experts always)."""
    h, heads = c.hidden_size, c.num_attention_heads
    q = h * heads * (c.qk_nope_head_dim + c.qk_rope_head_dim) if c.q_lora_rank is None else \
        c.q_lora_rank * (h + heads * (c.qk_nope_head_dim + c.qk_rope_head_dim))
    attn = q + h * (c.kv_lora_rank + c.qk_rope_head_dim) + heads * c.v_head_dim * h
    read = used = 0
    for i in layer_indices:
        if c.is_sparse_layer(i):
            m = c.moe
            expert = 3 * h * m.moe_intermediate_size
            always = h * m.n_routed_experts + m.n_shared_experts * expert
            read += attn + m.n_routed_experts * expert + always
            used += attn + m.num_experts_per_tok * expert + always
        else:
            read += attn + 3 * h * c.intermediate_size
            used += attn + 3 * h * c.intermediate_size
    return read, used


class DeepseekLayerTask:
    """Mixin for the DeepSeek-V2 decoder-layer (L3) and model (L4) tasks: one model, its (cut)
    config, the MLA dims as case parameters; CPU: the hand-picked paged batches; full: the steps
    of its captured workload (``captured_batch_cases``)."""

    models = {"cpu": (MLA_MODEL,), "full": (MLA_MODEL,)}
    depth = 1

    def layer_indices(self):
        return range(self.depth)

    def config(self, case):
        return deepseek_arch_config(case["profile"], self.depth, case.params.get("vocab_shard", 1), case["model"])

    def case_params(self, model, profile) -> Dict:
        return deepseek_dims(profile, model)

    def io_bytes(self, case):
        read, _ = deepseek_weight_elems(self.config(case), self.layer_indices())
        return self.attention_io(case) + read * torch.finfo(case.dtype).bits // 8

    def flops(self, case):
        _, used = deepseek_weight_elems(self.config(case), self.layer_indices())
        return self.attention_flops(case) + 2 * sum(case["query"]) * used
