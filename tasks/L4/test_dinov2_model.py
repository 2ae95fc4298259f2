"""Dinov2Model (L4): DINOv2-S/14 as an image encoder, normalised pixels in, the class token and patch
tokens after the final ``layernorm`` out (``last_hidden_state``; the CLS feature is its row 0).

Full profile: the real width (384, 6 heads of 64, MLP 1536) cut to ``LAYERS["full"]`` of its 12
layers, with the real 37 x 37 position table (518 px): one 224 px image (a request) and a batch of
32 (an embedding batch; 16 x 16 patches, the table resampled), and a landscape photo at 392 x 518
px (28 x 37 patches: dense features at the native width); bf16 as served, torch hub's float32 on the
224 px batch. CPU: a narrowed config (2 heads of the real 64, the real MLP ratio, 2 layers) whose
native grid is 4 x 4 (56 px): one image at its native size (the table as it is) and a pair of
42 x 28 px ones (3 x 2 patches, the table resampled, as every 224 px image of the real model is).
"""
import torch
from hypothesis import strategies as st

from fk_pytest import Case, Task, standard_tests
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L4.dinov2 import Dinov2Model

from ..configs import load_config
from ..L1.test_dinov2_position_embedding import TASK as POSITION_TASK
from ..L1.test_patch_embed import NORMALISATION, TASK as PATCH_EMBED_TASK, normalised_images
from ..L3.test_dinov2_layer import TASK as LAYER_TASK
from ..workload import HAND_PICKED_WEIGHT

MODEL = "dinov2-small"
LAYERS = {"cpu": 2, "full": 2}
# (height, width, batch) per profile
IMAGES = {"cpu": ((56, 56, 1), (42, 28, 2)), "full": ((224, 224, 1), (224, 224, 32), (392, 518, 1))}
FP32_SWEEP = {"cpu": (), "full": ((224, 224, 32),)}
CPU_WIDTH = (128, 2)  # (hidden, heads): heads of DINOv2's 64
CPU_NATIVE_IMAGE = 56  # a 4 x 4 table stands in for the real 37 x 37
# Fuzzed (hidden, heads) and native image sizes: ViT-S/B/L at patch 14 with DINOv2's 518 px table or a
# 224 px one; grid sides of served sizes (16: 224 px, 28 / 37: 392 / 518 px, 32: 448 px) or any.
WIDTHS = {"cpu": (CPU_WIDTH,), "full": ((384, 6), (768, 12), (1024, 16))}
NATIVE_IMAGES = {"cpu": (CPU_NATIVE_IMAGE,), "full": (518, 224)}
REAL_GRID_SIDES = (16, 28, 32, 37)
FUZZ = {"cpu": dict(max_side=4, max_batch=2, max_layers=1), "full": dict(max_side=40, max_batch=8, max_layers=2)}


class Dinov2ModelTask(Task):
    name = "dinov2_model"
    level = 4
    family = "model"
    module_path = "L4/dinov2.py"
    reference = Dinov2Model
    fuzz_dtypes = ("bf16",)

    def cases(self, profile):
        images = IMAGES[profile]
        weight = 1.0 if profile == "cpu" else 1.0 / len(images)
        out = [self._case(h, w, b, torch.bfloat16, weight, profile) for h, w, b in images]
        return out + [self._case(h, w, b, torch.float32, HAND_PICKED_WEIGHT, profile)
                      for h, w, b in FP32_SWEEP[profile]]

    def _case(self, height, width, batch, dt, weight, profile):
        cfg = load_config(MODEL)
        hidden, heads = (cfg["hidden_size"], cfg["num_attention_heads"]) if profile == "full" else CPU_WIDTH
        native = cfg["image_size"] if profile == "full" else CPU_NATIVE_IMAGE
        params = dict(height=height, width=width, batch=batch, layers=LAYERS[profile], hidden=hidden, heads=heads,
                      mlp_ratio=cfg["mlp_ratio"], image_size=native, patch=cfg["patch_size"],
                      eps=cfg["layer_norm_eps"], act=cfg["hidden_act"])
        size = f"{height}px" if height == width else f"{height}x{width}px"
        return Case(f"{MODEL}-L{LAYERS[profile]}-D{hidden}-{size}-B{batch}-{DTYPE_NAMES[dt]}", dt, model=MODEL,
                    weight=weight, params=params)

    def config(self, case):
        return dict(hidden_size=case["hidden"], num_attention_heads=case["heads"], num_hidden_layers=case["layers"],
                    mlp_ratio=case["mlp_ratio"], image_size=case["image_size"], patch_size=case["patch"],
                    num_channels=3, layer_norm_eps=case["eps"], hidden_act=case["act"], layerscale_value=1.0)

    def init_args(self, case):
        return {"config": self.config(case)}

    def init_weights(self, module, gen):
        """Each part as its own task draws it: the patch filters, a trained-looking position table
        and class token, every layer (LayerScale gains spread over 1e-2 .. 1), the final norm."""
        PATCH_EMBED_TASK.init_weights(module.embeddings.patch_embeddings, gen)
        POSITION_TASK.init_weights(module.embeddings.position_embedding, gen)
        for layer in module.encoder.layer:
            LAYER_TASK.init_weights(layer, gen)
        LAYER_TASK.init_weights(module.layernorm, gen)

    def make_inputs(self, case, gen, device):
        pixels = normalised_images(case["batch"], 3, case["height"], case["width"], case["patch"],
                                   NORMALISATION[MODEL], gen, device)
        return {"pixel_values": pixels.to(case.dtype)}

    def fuzz_strategy(self, dtype, profile):
        limits = FUZZ[profile]
        sides = st.one_of(st.sampled_from([s for s in REAL_GRID_SIDES if s <= limits["max_side"]] or [1]),
                          st.integers(1, limits["max_side"]))

        @st.composite
        def draw_case(draw):
            hidden, heads = draw(st.sampled_from(WIDTHS[profile]))
            native = draw(st.sampled_from(NATIVE_IMAGES[profile]))
            rows = draw(sides)
            cols = draw(st.one_of(st.just(rows), sides))  # square, or a photo's aspect ratio
            params = dict(height=rows * 14, width=cols * 14, batch=draw(st.integers(1, limits["max_batch"])),
                          layers=draw(st.integers(1, limits["max_layers"])), hidden=hidden, heads=heads,
                          mlp_ratio=4, image_size=native, patch=14, eps=1e-6, act="gelu")
            desc = f"L{params['layers']}-D{hidden}-native{native}-{rows * 14}x{cols * 14}px-B{params['batch']}"
            return Case(f"fuzz-{desc}-{DTYPE_NAMES[dtype]}", dtype, params=params)

        return draw_case()

    def output_names(self, case):
        return ("last_hidden_state",)

    def _patches(self, case) -> int:
        return (case["height"] // case["patch"]) * (case["width"] // case["patch"])

    def _weights(self, case) -> int:
        d = case["hidden"]
        layer = 4 * d * d + 2 * d * int(d * case["mlp_ratio"])
        table = (1 + (case["image_size"] // case["patch"]) ** 2) * d
        return case["layers"] * layer + 3 * case["patch"] ** 2 * d + table

    def io_bytes(self, case):
        b, d = case["batch"], case["hidden"]
        activations_io = b * 3 * case["height"] * case["width"] + b * (1 + self._patches(case)) * d
        return (self._weights(case) + activations_io) * torch.finfo(case.dtype).bits // 8

    def flops(self, case):
        b, n, d = case["batch"], 1 + self._patches(case), case["hidden"]
        layer = 4 * d * d + 2 * d * int(d * case["mlp_ratio"])
        per_token = 2 * (case["layers"] * layer + 3 * case["patch"] ** 2 * d)
        return b * n * per_token + case["layers"] * 4 * b * n * n * d


TASK = Dinov2ModelTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
