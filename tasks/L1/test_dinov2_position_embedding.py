"""Dinov2PositionEmbedding: DINOv2's class token prepended to the patch tokens and its 37 x 37 table of
learned position embeddings (518 px at patch 14) resampled bicubically to the image's grid, added.

Embedding serving sends DINOv2-S/14 one image or a batch of 32 at 224 px (16 x 16 patches), at
448 px (32 x 32: more detail for dense features) and a photo kept at its 3:4 aspect ratio (336 x 448
px: 24 x 32). Served in bf16; torch hub's float32 run is swept at 224 px. The table looks like a
trained one (smooth over the grid plus cell-to-cell detail), so the resampling kernel, its pixel
centres and which rows it takes are all visible.
"""
import torch
from hypothesis import strategies as st

from fk_pytest import Case, Task, standard_tests
from fk_pytest.fuzz import real_or_near
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L1.dinov2_embeddings import Dinov2PositionEmbedding

from ..configs import load_config
from ..workload import HAND_PICKED_WEIGHT, activations

MODEL = "dinov2-small"
# (grid height, grid width, batch) per profile. CPU: grids of a few patches (the table is still the
# native 37 x 37 one), square and not.
GRIDS = {"cpu": ((4, 4, 2), (3, 5, 1)),
         "full": ((16, 16, 1), (16, 16, 32), (32, 32, 1), (32, 32, 32), (24, 32, 1), (24, 32, 32))}
FP32_SWEEP = {"cpu": ((2, 3, 1),), "full": ((16, 16, 32),)}
# Fuzz: native tables of DINOv2 at 518 px (37) and of a ViT trained at 224 px (16), grids around
# real ones (the native one, where nothing is resampled, included); widths of ViT-S/B/L/g.
NATIVE_IMAGES = ((518, 14), (224, 14))
REAL_GRID_SIDES = (16, 24, 32, 37)
OTHER_REAL_WIDTHS = (768, 1024, 1536)
FUZZ = {"cpu": dict(max_side=6, max_batch=2), "full": dict(max_side=48, max_batch=32)}


class Dinov2PositionEmbeddingTask(Task):
    name = "dinov2_position_embedding"
    level = 1
    family = "embedding"
    module_path = "L1/dinov2_embeddings.py"
    reference = Dinov2PositionEmbedding
    fuzz_dtypes = ("bf16", "fp32")

    def cases(self, profile):
        grids = GRIDS[profile]
        weight = 1.0 if profile == "cpu" else 1.0 / len(grids)
        out = [self.grid_case(h, w, b, torch.bfloat16, weight) for h, w, b in grids]
        hand = 1.0 if profile == "cpu" else HAND_PICKED_WEIGHT
        return out + [self.grid_case(h, w, b, torch.float32, hand) for h, w, b in FP32_SWEEP[profile]]

    def grid_case(self, grid_height, grid_width, batch, dt, weight=1.0):
        cfg = load_config(MODEL)
        p = cfg["patch_size"]
        size = f"{grid_height * p}px" if grid_height == grid_width else f"{grid_height * p}x{grid_width * p}px"
        return Case(f"{MODEL}-{size}-B{batch}-{DTYPE_NAMES[dt]}", dt, model=MODEL, weight=weight,
                    params=dict(grid_height=grid_height, grid_width=grid_width, batch=batch,
                                hidden=cfg["hidden_size"], image_size=cfg["image_size"], patch=p))

    def init_args(self, case):
        return {"hidden_size": case["hidden"], "image_size": case["image_size"], "patch_size": case["patch"]}

    def init_weights(self, module, gen):
        """A trained table's look: a smooth field over the grid (a few cycles across the image) plus
        cell-to-cell detail of a third of its size, entries of RMS about 0.5 against patch tokens of
        RMS about 1; a class token and a class row of the same size."""
        pos, cls = module.position_embeddings, module.cls_token
        g, d, dev = module.native_grid, pos.shape[-1], pos.device
        with torch.no_grad():
            coarse = torch.randn((1, d, 6, 6), generator=gen, device=dev)
            smooth = torch.nn.functional.interpolate(coarse, size=(g, g), mode="bicubic", align_corners=True)
            detail = torch.randn((1, d, g, g), generator=gen, device=dev)
            field = (0.45 * smooth + 0.15 * detail).permute(0, 2, 3, 1).reshape(1, g * g, d)
            class_row = 0.5 * torch.randn((1, 1, d), generator=gen, device=dev)
            pos.copy_(torch.cat((class_row, field), dim=1))
            cls.copy_(0.5 * torch.randn(cls.shape, generator=gen, device=dev))

    def make_inputs(self, case, gen, device):
        n = case["grid_height"] * case["grid_width"]
        return {"embeddings": activations((case["batch"], n, case["hidden"]), gen, device, case.dtype),
                "grid_height": case["grid_height"], "grid_width": case["grid_width"]}

    def fuzz_strategy(self, dtype, profile):
        limits = FUZZ[profile]
        widths = sorted({load_config(MODEL)["hidden_size"], *OTHER_REAL_WIDTHS})
        sides = st.one_of(st.sampled_from([s for s in REAL_GRID_SIDES if s <= limits["max_side"]] or [1]),
                          st.integers(1, limits["max_side"]))

        @st.composite
        def draw_case(draw):
            image_size, patch = draw(st.sampled_from(NATIVE_IMAGES))
            h = draw(sides)
            w = draw(st.one_of(st.just(h), sides))
            params = dict(grid_height=h, grid_width=w, batch=draw(st.integers(1, limits["max_batch"])),
                          hidden=draw(real_or_near(widths)), image_size=image_size, patch=patch)
            desc = f"native{image_size // patch}-{h}x{w}-B{params['batch']}-D{params['hidden']}"
            return Case(f"fuzz-{desc}-{DTYPE_NAMES[dtype]}", dtype, params=params)

        return draw_case()

    def io_bytes(self, case):
        b, n, d = case["batch"], case["grid_height"] * case["grid_width"], case["hidden"]
        g = case["image_size"] // case["patch"]
        table = (1 + min(g * g, 16 * n)) * d  # bicubic reads at most 4 x 4 native cells per output cell
        return (b * n * d + table + d + b * (1 + n) * d) * torch.finfo(case.dtype).bits // 8

    def flops(self, case):
        b, n, d = case["batch"], case["grid_height"] * case["grid_width"], case["hidden"]
        return 2 * 8 * n * d + b * (1 + n) * d  # two 4-tap passes per resampled entry, one add per output


TASK = Dinov2PositionEmbeddingTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
