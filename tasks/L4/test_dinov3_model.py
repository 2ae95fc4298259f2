"""DINOv3ViTModel (L4): DINOv3 ViT-L/16 as an image encoder, normalised pixels in, the class, register
and patch tokens after the final ``norm`` out (``last_hidden_state``; the CLS feature is its row 0).

Full profile: the real width (1024, 16 heads of 64, MLP 4096, 4 registers) cut to ``LAYERS["full"]``
of its 24 layers, at 224 px (14 x 14 patches) and 512 px (32 x 32), one image (a request) and a
batch of 32 (an embedding batch); bf16 as served, float32 (torch hub) on the 224 px batch. CPU: a
narrowed config (2 heads of the real 64, the real MLP ratio, the 4 registers, 2 layers) on a pair of
32 px images (2 x 2 patches) and a 48 x 32 px one (3 x 2: the rotary grid's axes differ).
"""
import torch
from hypothesis import strategies as st

from fk_pytest import Case, Task, standard_tests
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L4.dinov3 import DINOv3ViTModel

from ..configs import load_config
from ..workload import HAND_PICKED_WEIGHT
from ..L1.test_patch_embed import NORMALISATION, TASK as PATCH_EMBED_TASK, normalised_images
from ..L3.test_dinov2_layer import TASK as DINOV2_LAYER_TASK
from ..L3.test_dinov3_layer import CPU_WIDTH, draw_layer_weights, layer_config

MODEL = "dinov3-vitl16"
LAYERS = {"cpu": 2, "full": 2}
# (height, width, batch) per profile
IMAGES = {"cpu": ((32, 32, 2), (48, 32, 1)), "full": ((224, 224, 1), (224, 224, 32), (512, 512, 1), (512, 512, 32))}
FP32_SWEEP = {"cpu": (), "full": ((224, 224, 32),)}
# Fuzzed (hidden, heads, intermediate): DINOv3 ViT-S/B/L (the CPU its cut only); grid sides of served
# sizes (14 / 32: 224 / 512 px; 30 x 40: a 3:4 photo) or any, sometimes with pixels past the last patch.
WIDTHS = {"cpu": (CPU_WIDTH,), "full": ((384, 6, 1536), (768, 12, 3072), (1024, 16, 4096))}
REAL_GRID_SIDES = (14, 30, 32, 40)
REGISTERS = (4, 0)
FUZZ = {"cpu": dict(max_side=3, max_batch=2, max_layers=1), "full": dict(max_side=40, max_batch=8, max_layers=2)}
PREFIX_TOKEN_SCALE = 1.0  # class and register tokens of the patch tokens' RMS


class DINOv3ViTModelTask(Task):
    name = "dinov3_model"
    level = 4
    family = "model"
    module_path = "L4/dinov3.py"
    reference = DINOv3ViTModel
    fuzz_dtypes = ("bf16",)

    def cases(self, profile):
        images = IMAGES[profile]
        weight = 1.0 if profile == "cpu" else 1.0 / len(images)
        out = [self._case(h, w, b, torch.bfloat16, weight, profile) for h, w, b in images]
        hand = 1.0 if profile == "cpu" else HAND_PICKED_WEIGHT
        return out + [self._case(h, w, b, torch.float32, hand, profile) for h, w, b in FP32_SWEEP[profile]]

    def _case(self, height, width, batch, dt, weight, profile):
        cfg = load_config(MODEL)
        hidden, heads, inter = ((cfg["hidden_size"], cfg["num_attention_heads"], cfg["intermediate_size"])
                                if profile == "full" else CPU_WIDTH)
        params = dict(height=height, width=width, batch=batch, layers=LAYERS[profile], hidden=hidden, heads=heads,
                      intermediate=inter, registers=cfg["num_register_tokens"], patch=cfg["patch_size"])
        size = f"{height}px" if height == width else f"{height}x{width}px"
        return Case(f"{MODEL}-L{LAYERS[profile]}-D{hidden}-{size}-B{batch}-{DTYPE_NAMES[dt]}", dt, model=MODEL,
                    weight=weight, params=params)

    def config(self, case):
        cfg = layer_config(case["hidden"], case["heads"], case["intermediate"], case["registers"])
        return dict(cfg, num_hidden_layers=case["layers"], patch_size=case["patch"])

    def init_args(self, case):
        return {"config": self.config(case)}

    def init_weights(self, module, gen):
        """Each part as its own task draws it: the patch filters, every layer (LayerScale gains spread
        over 1e-2 .. 1, no key bias), the final norm; class and register tokens of the patch tokens' scale."""
        embeddings = module.embeddings
        PATCH_EMBED_TASK.init_weights(embeddings.patch_embeddings, gen)
        with torch.no_grad():
            for token in (embeddings.cls_token, embeddings.register_tokens):
                token.copy_(PREFIX_TOKEN_SCALE * torch.randn(token.shape, generator=gen, device=token.device))
        for layer in module.model.layer:
            draw_layer_weights(layer, gen)
        DINOV2_LAYER_TASK.init_weights(module.norm, gen)

    def make_inputs(self, case, gen, device):
        pixels = normalised_images(case["batch"], 3, case["height"], case["width"], case["patch"],
                                   NORMALISATION[MODEL], gen, device)
        return {"pixel_values": pixels.to(case.dtype)}

    def fuzz_strategy(self, dtype, profile):
        limits = FUZZ[profile]
        sides = st.one_of(st.sampled_from([s for s in REAL_GRID_SIDES if s <= limits["max_side"]] or [1]),
                          st.integers(1, limits["max_side"]))
        spare = st.one_of(st.just(0), st.integers(1, 15))  # pixels past the last whole patch

        @st.composite
        def draw_case(draw):
            hidden, heads, inter = draw(st.sampled_from(WIDTHS[profile]))
            rows = draw(sides)
            cols = draw(st.one_of(st.just(rows), sides))
            params = dict(height=rows * 16 + draw(spare), width=cols * 16 + draw(spare),
                          batch=draw(st.integers(1, limits["max_batch"])),
                          layers=draw(st.integers(1, limits["max_layers"])),
                          hidden=hidden, heads=heads, intermediate=inter, registers=draw(st.sampled_from(REGISTERS)),
                          patch=16)
            desc = (f"L{params['layers']}-D{hidden}-{params['height']}x{params['width']}px-B{params['batch']}"
                    f"-reg{params['registers']}")
            return Case(f"fuzz-{desc}-{DTYPE_NAMES[dtype]}", dtype, params=params)

        return draw_case()

    def output_names(self, case):
        return ("last_hidden_state",)

    def _tokens(self, case) -> int:
        return 1 + case["registers"] + (case["height"] // case["patch"]) * (case["width"] // case["patch"])

    def _weights(self, case) -> int:
        d = case["hidden"]
        layer = 4 * d * d + 2 * d * case["intermediate"]
        return case["layers"] * layer + 3 * case["patch"] ** 2 * d + (1 + case["registers"]) * d

    def io_bytes(self, case):
        b, d = case["batch"], case["hidden"]
        activations_io = b * 3 * case["height"] * case["width"] + b * self._tokens(case) * d
        return (self._weights(case) + activations_io) * torch.finfo(case.dtype).bits // 8

    def flops(self, case):
        b, n, d = case["batch"], self._tokens(case), case["hidden"]
        layer = 4 * d * d + 2 * d * case["intermediate"]
        patches = (case["height"] // case["patch"]) * (case["width"] // case["patch"])
        gemms = 2 * b * (n * case["layers"] * layer + patches * 3 * case["patch"] ** 2 * d)
        return gemms + case["layers"] * 4 * b * n * n * d


TASK = DINOv3ViTModelTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
