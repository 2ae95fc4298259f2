"""SiglipVisionModel (L4): SigLIP-2 so400m/14's vision tower, normalised pixels in, the patch tokens
after ``post_layernorm`` out (the pooling head is not part of the model; see the reference).

Full profile: the real width (1152, 16 heads of 72, MLP 4304) at the native 384 px (27 x 27 = 729
tokens, 6 pixels past the last patch unread), cut to ``LAYERS["full"]`` of its 27 layers; one image
and a batch of 8, bf16 as served, and the batch in float32. CPU: 2 heads of the real 72, the MLP in
the real ratio, 2 layers, on a 48 px image (a 3 x 3 grid with 6 pixels to spare, as 384 px has) and
a pair of 28 px ones (2 x 2). The position table is the native grid's, so each image size is its
own model (the cut config's ``image_size``).
"""
import torch
from hypothesis import strategies as st

from fk_pytest import Case, Task, standard_tests
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L4.siglip import SiglipVisionModel

from ..configs import load_config
from ..L1.test_patch_embed import NORMALISATION, TASK as PATCH_EMBED_TASK, normalised_images
from ..L3.test_siglip_encoder_layer import TASK as LAYER_TASK
from ..workload import HAND_PICKED_WEIGHT

MODEL = "siglip2-so400m-vision"
LAYERS = {"cpu": 2, "full": 2}
# (image side in pixels, batch) per profile
IMAGES = {"cpu": ((48, 1), (28, 2)), "full": ((384, 1), (384, 8))}
FP32_SWEEP = {"cpu": (), "full": ((384, 8),)}
CPU_WIDTH = (144, 2, 538)  # (hidden, heads, intermediate): the layer task's CPU cut
# Fuzzed (hidden, heads, intermediate, patch): so400m/14, SigLIP B/16 and L/16; grid sides of their
# served sizes (16: 224 px at 16, 24: 384 px at 16, 27: 384 px at 14) or any up to the limit.
WIDTHS = {"cpu": (CPU_WIDTH + (14,),), "full": ((1152, 16, 4304, 14), (768, 12, 3072, 16), (1024, 16, 4096, 16))}
REAL_GRID_SIDES = (16, 24, 27)
FUZZ = {"cpu": dict(max_side=3, max_batch=2, max_layers=1), "full": dict(max_side=32, max_batch=4, max_layers=2)}
POSITION_SCALE = 0.5  # the table against patch tokens of RMS 1-2: visible, not dominant


class SiglipVisionModelTask(Task):
    name = "siglip_vision_model"
    level = 4
    family = "model"
    module_path = "L4/siglip.py"
    reference = SiglipVisionModel
    fuzz_dtypes = ("bf16",)

    def cases(self, profile):
        images = IMAGES[profile]
        weight = 1.0 if profile == "cpu" else 1.0 / len(images)
        out = [self._case(side, b, torch.bfloat16, weight, profile) for side, b in images]
        return out + [self._case(side, b, torch.float32, HAND_PICKED_WEIGHT, profile)
                      for side, b in FP32_SWEEP[profile]]

    def _case(self, side, batch, dt, weight, profile):
        cfg = load_config(MODEL)
        hidden, heads, inter = ((cfg["hidden_size"], cfg["num_attention_heads"], cfg["intermediate_size"])
                                if profile == "full" else CPU_WIDTH)
        params = dict(side=side, batch=batch, layers=LAYERS[profile], hidden=hidden, heads=heads,
                      intermediate=inter, patch=cfg["patch_size"], eps=cfg["layer_norm_eps"], act=cfg["hidden_act"])
        return Case(f"{MODEL}-L{LAYERS[profile]}-D{hidden}-{side}px-B{batch}-{DTYPE_NAMES[dt]}", dt, model=MODEL,
                    weight=weight, params=params)

    def config(self, case):
        return dict(hidden_size=case["hidden"], num_attention_heads=case["heads"],
                    intermediate_size=case["intermediate"], num_hidden_layers=case["layers"],
                    image_size=case["side"], patch_size=case["patch"], num_channels=3,
                    layer_norm_eps=case["eps"], hidden_act=case["act"])

    def init_args(self, case):
        return {"config": self.config(case)}

    def init_weights(self, module, gen):
        """The patch embedding's filters as the patch_embed task draws them, the position table
        at ``POSITION_SCALE``, every layer and the final norm as the layer task draws them."""
        PATCH_EMBED_TASK.init_weights(module.embeddings.patch_embedding, gen)
        table = module.embeddings.position_embedding.weight
        with torch.no_grad():
            table.copy_(POSITION_SCALE * torch.randn(table.shape, generator=gen, device=table.device))
        for layer in module.encoder.layers:
            LAYER_TASK.init_weights(layer, gen)
        LAYER_TASK.init_weights(module.post_layernorm, gen)

    def make_inputs(self, case, gen, device):
        side = case["side"]
        pixels = normalised_images(case["batch"], 3, side, side, case["patch"], NORMALISATION[MODEL], gen, device)
        return {"pixel_values": pixels.to(case.dtype)}

    def fuzz_strategy(self, dtype, profile):
        limits = FUZZ[profile]
        sides = st.one_of(st.sampled_from([s for s in REAL_GRID_SIDES if s <= limits["max_side"]] or [1]),
                          st.integers(1, limits["max_side"]))

        @st.composite
        def draw_case(draw):
            hidden, heads, inter, patch = draw(st.sampled_from(WIDTHS[profile]))
            side = draw(sides) * patch + draw(st.one_of(st.just(0), st.integers(1, patch - 1)))
            params = dict(side=side, batch=draw(st.integers(1, limits["max_batch"])),
                          layers=draw(st.integers(1, limits["max_layers"])), hidden=hidden, heads=heads,
                          intermediate=inter, patch=patch, eps=1e-6, act="gelu_pytorch_tanh")
            desc = f"L{params['layers']}-D{hidden}-p{patch}-{side}px-B{params['batch']}"
            return Case(f"fuzz-{desc}-{DTYPE_NAMES[dtype]}", dtype, params=params)

        return draw_case()

    def output_names(self, case):
        return ("last_hidden_state",)

    def _tokens(self, case) -> int:
        return (case["side"] // case["patch"]) ** 2

    def _weights(self, case) -> int:
        d, n = case["hidden"], self._tokens(case)
        layer = 4 * d * d + 2 * d * case["intermediate"]
        return case["layers"] * layer + 3 * case["patch"] ** 2 * d + n * d

    def io_bytes(self, case):
        b, side, d = case["batch"], case["side"], case["hidden"]
        activations_io = b * 3 * side * side + b * self._tokens(case) * d
        return (self._weights(case) + activations_io) * torch.finfo(case.dtype).bits // 8

    def flops(self, case):
        b, n, d = case["batch"], self._tokens(case), case["hidden"]
        layer = 4 * d * d + 2 * d * case["intermediate"]
        per_token = 2 * (case["layers"] * layer + 3 * case["patch"] ** 2 * d)
        return b * n * per_token + case["layers"] * 4 * b * n * n * d


TASK = SiglipVisionModelTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
