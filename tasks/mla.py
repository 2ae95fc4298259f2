"""Shared shape of the tasks that attend over DeepSeek's paged *latent* cache (L1 MLAAttention, L2
DeepseekV2MLAAttention): the batches, metadata and block shuffling of :mod:`tasks.paged`, with one
cache per layer, ``kv_cache_<i>`` [num_blocks, block_size, kv_lora_rank + rope], as an input whose
state after the call is an output (the layer must store the step's latent rows at the slot mapping).

Profiles: the full one is DeepSeek-V2-Lite as served (16 heads; decode B1 C8192, B32 C2048,
B128 C1024 and the prefill batches of ``tasks.paged``); the CPU one keeps the real head dims
(nope 128, rope 64, v 128, latent 512) with 2 heads and short contexts, and mixes decode, fresh
prefill and chunked prefill in one batch.
"""
from typing import Dict, List

import torch

from fk_pytest import Case
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.forward_context import AttentionMetadata, set_forward_context
from kernels_reference.L2.deepseek_v2_attention import softmax_scale

from .configs import load_config
from .paged import BATCHES, BLOCK_SIZE, PagedTask
from .workload import activations, model_dtype

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
    models = {"cpu": (MLA_MODEL,), "full": (MLA_MODEL,)}

    def cases(self, profile) -> List[Case]:
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
        args = {k: v for k, v in inputs.items() if k != "metadata" and k not in self.cache_names()}
        with set_forward_context(inputs["metadata"]):
            return (getattr(module, method) if method else module)(**args)

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
