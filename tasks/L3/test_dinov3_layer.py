"""DINOv3ViTLayer (L3): DINOv3's pre-norm ViT block, the 2-D rotary embedding on the patch tokens' q and
k, attention and GELU MLP each scaled by a per-channel LayerScale gain before its residual add, over
a batch of images [B, S, D] (S = 1 class + 4 register tokens + the patches).

DINOv3 ViT-L/16 (1024 wide, 16 heads of 64, MLP 4096, no key bias) at 224 px (14 x 14 patches, 201
tokens), one image (a request) or 32 (a batch), and a batch of 32 at 512 px (32 x 32, 1029 tokens);
bf16 as served, float32 (torch hub) on the 224 px batch. The CPU runs a narrowed layer (2 heads of the
real 64, the real MLP ratio) on a 2 x 2 grid (a pair of images) and a 3 x 2 one.
"""
import torch
from hypothesis import strategies as st

from fk_pytest import Case, Task, standard_tests
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L3.dinov3_layer import DINOv3ViTLayer

from ..configs import load_config
from ..workload import HAND_PICKED_WEIGHT, activations
from .test_dinov2_layer import TASK as DINOV2_LAYER_TASK

MODEL = "dinov3-vitl16"
# (grid height, grid width, batch) per profile
GRIDS = {"cpu": ((2, 2, 2), (3, 2, 1)), "full": ((14, 14, 1), (14, 14, 32), (32, 32, 32))}
FP32_SWEEP = {"cpu": (), "full": ((14, 14, 32),)}
CPU_WIDTH = (128, 2, 512)  # (hidden, heads, intermediate): heads of the real 64, the real MLP ratio
# Fuzzed (hidden, heads, intermediate): DINOv3 ViT-S/B/L (the CPU its cut only); grid sides of served
# sizes (14 / 32: 224 / 512 px; 30 x 40: a 3:4 photo) or any; 4 register tokens or none.
WIDTHS = {"cpu": (CPU_WIDTH,), "full": ((384, 6, 1536), (768, 12, 3072), (1024, 16, 4096))}
REAL_GRID_SIDES = (14, 30, 32, 40)
REGISTERS = (4, 0)
FUZZ = {"cpu": dict(max_side=3, max_batch=2), "full": dict(max_side=40, max_batch=32)}


def layer_config(hidden: int, heads: int, intermediate: int, registers: int) -> dict:
    """The model's config with the layer's width (and register count) set; the other fields as published."""
    cfg = {k: v for k, v in load_config(MODEL).items() if not k.startswith("_")}
    return dict(cfg, hidden_size=hidden, num_attention_heads=heads, intermediate_size=intermediate,
                num_register_tokens=registers)


def draw_layer_weights(module, gen):
    """Matrices of trained scale, biases of 0.1, norm gains near 1, LayerScale gains spread over
    1e-2 .. 1 (as the DINOv2 layer task draws them); the bias rows of parts the config gives no bias
    (DINOv3's key) stay zero."""
    DINOV2_LAYER_TASK.init_weights(module, gen)
    for layer in (m for m in module.modules() if isinstance(m, DINOv3ViTLayer)):
        with torch.no_grad():
            for rows in layer.attention.zero_bias_rows():
                layer.attention.qkv_proj.bias[rows] = 0


class DINOv3ViTLayerTask(Task):
    name = "dinov3_layer"
    level = 3
    family = "layer"
    module_path = "L3/dinov3_layer.py"
    reference = DINOv3ViTLayer
    fuzz_dtypes = ("bf16",)  # served in bf16; float32 is a hand-picked full-profile case

    def cases(self, profile):
        grids = GRIDS[profile]
        weight = 1.0 if profile == "cpu" else 1.0 / len(grids)
        out = [self._case(h, w, b, torch.bfloat16, weight, profile) for h, w, b in grids]
        hand = 1.0 if profile == "cpu" else HAND_PICKED_WEIGHT
        return out + [self._case(h, w, b, torch.float32, hand, profile) for h, w, b in FP32_SWEEP[profile]]

    def _case(self, grid_height, grid_width, batch, dt, weight, profile):
        cfg = load_config(MODEL)
        hidden, heads, inter = ((cfg["hidden_size"], cfg["num_attention_heads"], cfg["intermediate_size"])
                                if profile == "full" else CPU_WIDTH)
        p = cfg["patch_size"]
        size = f"{grid_height * p}px" if grid_height == grid_width else f"{grid_height * p}x{grid_width * p}px"
        params = dict(grid_height=grid_height, grid_width=grid_width, batch=batch, hidden=hidden, heads=heads,
                      intermediate=inter, registers=cfg["num_register_tokens"])
        return Case(f"{MODEL}-D{hidden}-{size}-B{batch}-{DTYPE_NAMES[dt]}", dt, model=MODEL, weight=weight,
                    params=params)

    def init_args(self, case):
        return {"config": layer_config(case["hidden"], case["heads"], case["intermediate"], case["registers"])}

    def init_weights(self, module, gen):
        draw_layer_weights(module, gen)

    def make_inputs(self, case, gen, device):
        # the residual stream mid-stack: larger than the normed branch inputs, with outlier channels
        tokens = 1 + case["registers"] + case["grid_height"] * case["grid_width"]
        shape = (case["batch"], tokens, case["hidden"])
        return {"hidden_states": activations(shape, gen, device, case.dtype, scale=2.0),
                "grid_height": case["grid_height"], "grid_width": case["grid_width"]}

    def fuzz_strategy(self, dtype, profile):
        limits = FUZZ[profile]
        sides = st.one_of(st.sampled_from([s for s in REAL_GRID_SIDES if s <= limits["max_side"]] or [1]),
                          st.integers(1, limits["max_side"]))

        @st.composite
        def draw_case(draw):
            hidden, heads, inter = draw(st.sampled_from(WIDTHS[profile]))
            rows = draw(sides)
            params = dict(grid_height=rows, grid_width=draw(st.one_of(st.just(rows), sides)),
                          batch=draw(st.integers(1, limits["max_batch"])), hidden=hidden, heads=heads,
                          intermediate=inter, registers=draw(st.sampled_from(REGISTERS)))
            desc = (f"D{hidden}-{params['grid_height']}x{params['grid_width']}-B{params['batch']}"
                    f"-reg{params['registers']}")
            return Case(f"fuzz-{desc}-{DTYPE_NAMES[dtype]}", dtype, params=params)

        return draw_case()

    def _tokens(self, case) -> int:
        return 1 + case["registers"] + case["grid_height"] * case["grid_width"]

    def _weights(self, case) -> int:
        d = case["hidden"]
        return 4 * d * d + 2 * d * case["intermediate"]

    def io_bytes(self, case):
        activations_io = 2 * case["batch"] * self._tokens(case) * case["hidden"]
        return (self._weights(case) + activations_io) * torch.finfo(case.dtype).bits // 8

    def flops(self, case):
        b, s, d = case["batch"], self._tokens(case), case["hidden"]
        return 2 * b * s * self._weights(case) + 4 * b * s * s * d


TASK = DINOv3ViTLayerTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
