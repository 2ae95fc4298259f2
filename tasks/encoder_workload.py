"""The embedding-serving batches the encoder and vision tasks' per-token ops (LayerNorm, GELU) see.

Token counts per model and profile: padded 512-token text batches, one or 32 images of 257 / 1025
(DINOv2 at 224 / 448 px, class token included) or 729 patches (SigLIP at 384 px). CPU: tiny real
shapes (a 7-token query; 1 + 4 x 4 DINOv2 tokens of a 56 px image; 3 x 3 SigLIP patches), since
Triton candidates run interpreted there. Served in bf16; the checkpoints are float32 and DINOv2
and BGE-M3 are also run that way (torch hub DINOv2, sentence-transformers' default), so float32 is
swept on those two at a few sizes.
"""
from typing import Callable, Iterable, List

import torch

from .workload import HAND_PICKED_WEIGHT

TEXT_MODELS = ("all-minilm-l6-v2", "bge-m3")
VISION_MODELS = ("dinov2-small", "siglip2-so400m-vision")
TOKENS = {
    "cpu": {"all-minilm-l6-v2": (("query", 7),), "bge-m3": (("query", 7),),
            "dinov2-small": (("image", 17),), "siglip2-so400m-vision": (("image", 9),)},
    "full": {"all-minilm-l6-v2": (("query", 32), ("batch", 8 * 512), ("batch", 32 * 512)),
             "bge-m3": (("query", 32), ("batch", 32 * 512), ("long", 8192)),
             "dinov2-small": (("image", 257), ("batch", 32 * 257), ("batch", 32 * 1025)),
             "siglip2-so400m-vision": (("image", 729), ("batch", 32 * 729))},
}
FP32_SWEEP = {"cpu": {"dinov2-small": (7,), "bge-m3": (7,)},
              "full": {"dinov2-small": (257, 8224), "bge-m3": (32, 16384)}}


def token_cases(profile: str, variants: Iterable[str], case: Callable, models: Iterable[str] = None) -> List:
    """``case(model, phase, tokens, variant, dtype, weight)`` over every model's bf16 token counts
    (weight 1 per model on the full profile) and the float32 sweep (hand-picked weight)."""
    variants = tuple(variants)
    models = tuple(models) if models is not None else tuple(TOKENS[profile])
    out = []
    for model in models:
        entries = TOKENS[profile][model]
        weight = 1.0 if profile == "cpu" else 1.0 / (len(entries) * len(variants))
        for phase, t in entries:
            for variant in variants:
                out.append(case(model, phase, t, variant, torch.bfloat16, weight))
    weight = 1.0 if profile == "cpu" else HAND_PICKED_WEIGHT
    for model, counts in FP32_SWEEP[profile].items():
        for t in counts:
            for variant in variants:
                out.append(case(model, "sweep", t, variant, torch.float32, weight))
    return out
