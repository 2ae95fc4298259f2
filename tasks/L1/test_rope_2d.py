"""DINOv3ViTRopePositionEmbedding: DINOv3's 2-D rotary embedding of the patch tokens' queries and keys
(the class and register tokens in front of them are not rotated).

Called by every attention layer of DINOv3 ViT-L/16 on its q and k, column slices of the fused qkv
output ``[B, S, 3 * 1024]`` (16 heads of 64), S = 1 class + 4 register + the patches. Embedding
serving sends batches of 32 to 64 images at 224 px (14 x 14 patches) and 512 px (32 x 32), and a
480 x 640 photo batch kept at its aspect ratio (30 x 40, where each axis is normalised by its own
patch count); bf16 as served, float32 (torch hub) at 224 px. The CPU runs the real heads on grids of a
few patches, square and not.
"""
import torch
from hypothesis import strategies as st

from fk_pytest import Case, Task, standard_tests
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L1.rope_2d import DINOv3ViTRopePositionEmbedding

from ..configs import head_dim, load_config
from ..workload import HAND_PICKED_WEIGHT, activations

MODEL = "dinov3-vitl16"
# (grid height, grid width, batch) per profile
GRIDS = {"cpu": ((2, 2, 2), (3, 2, 1)),
         "full": ((14, 14, 32), (14, 14, 64), (32, 32, 32), (32, 32, 64), (30, 40, 32))}
FP32_SWEEP = {"cpu": ((2, 3, 1),), "full": ((14, 14, 32),)}
# Fuzz: head sizes of DINOv3 (64: ViT-S/B/L/H+, 128: ViT-7B), prefixes with 4 registers or the
# class token alone, grid sides of served sizes (14 / 32: 224 / 512 px; 30 x 40: a 3:4 photo).
HEAD_SIZES = (64, 128)
PREFIXES = (5, 1)
REAL_GRID_SIDES = (14, 30, 32, 40)
FUZZ = {"cpu": dict(max_side=4, max_batch=2, max_heads=4), "full": dict(max_side=48, max_batch=64, max_heads=32)}
MAX_ELEMENTS = 1 << 26  # of one of q / k: the float64 truth of the largest draws stays a few GB
LAYOUTS = ("qkv-split", "heads")  # the layer's column views, or contiguous [B, S, heads, head_size]


def prefix_tokens(cfg) -> int:
    return 1 + cfg.get("num_register_tokens", 0)


class RopePositionEmbedding2DTask(Task):
    name = "rope_2d"
    level = 1
    family = "rope"
    module_path = "L1/rope_2d.py"
    reference = DINOv3ViTRopePositionEmbedding
    may_mutate = ("query", "key")  # the fast path rotates the qkv views in place
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
        params = dict(grid_height=grid_height, grid_width=grid_width, batch=batch, head_size=head_dim(cfg),
                      heads=cfg["num_attention_heads"], prefix=prefix_tokens(cfg), base=float(cfg["rope_theta"]),
                      layout="qkv-split")
        return Case(f"{MODEL}-{size}-B{batch}-{DTYPE_NAMES[dt]}", dt, model=MODEL, weight=weight, params=params)

    def init_args(self, case):
        return dict(head_size=case["head_size"], base=case["base"], num_prefix_tokens=case["prefix"])

    def make_inputs(self, case, gen, device):
        tokens = case["prefix"] + case["grid_height"] * case["grid_width"]
        width = case["heads"] * case["head_size"]
        if case["layout"] == "qkv-split":
            qkv = activations((case["batch"], tokens, 3 * width), gen, device, case.dtype)
            query, key = qkv[..., :width], qkv[..., width: 2 * width]
        else:
            shape = (case["batch"], tokens, case["heads"], case["head_size"])
            query = activations(shape, gen, device, case.dtype)
            key = activations(shape, gen, device, case.dtype)
        return {"query": query, "key": key, "grid_height": case["grid_height"], "grid_width": case["grid_width"]}

    def output_names(self, case):
        return ("query", "key")

    def fuzz_strategy(self, dtype, profile):
        limits = FUZZ[profile]
        sides = st.one_of(st.sampled_from([s for s in REAL_GRID_SIDES if s <= limits["max_side"]] or [1]),
                          st.integers(1, limits["max_side"]))

        @st.composite
        def draw_case(draw):
            rows = draw(sides)
            params = dict(grid_height=rows, grid_width=draw(st.one_of(st.just(rows), sides)),
                          batch=draw(st.integers(1, limits["max_batch"])), head_size=draw(st.sampled_from(HEAD_SIZES)),
                          heads=draw(st.integers(1, limits["max_heads"])), prefix=draw(st.sampled_from(PREFIXES)),
                          base=100.0, layout=draw(st.sampled_from(LAYOUTS)))
            per_image = (params["prefix"] + rows * params["grid_width"]) * params["heads"] * params["head_size"]
            params["batch"] = max(1, min(params["batch"], MAX_ELEMENTS // per_image))
            desc = (f"{params['grid_height']}x{params['grid_width']}-B{params['batch']}-h{params['heads']}"
                    f"x{params['head_size']}-p{params['prefix']}-{params['layout']}")
            return Case(f"fuzz-{desc}-{DTYPE_NAMES[dtype]}", dtype, params=params)

        return draw_case()

    def _rotated(self, case) -> int:
        """Elements rotated in q and k together: the patch tokens only."""
        return 2 * case["batch"] * case["grid_height"] * case["grid_width"] * case["heads"] * case["head_size"]

    def io_bytes(self, case):
        # In place: the patch rows read and written once; plus one cos/sin row per patch (float32).
        table = case["grid_height"] * case["grid_width"] * case["head_size"] * 4
        return 2 * self._rotated(case) * torch.finfo(case.dtype).bits // 8 + table

    def flops(self, case):
        return 3 * self._rotated(case)


TASK = RopePositionEmbedding2DTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
