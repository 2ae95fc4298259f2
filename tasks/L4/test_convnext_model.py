"""ConvNextV2Model (L4): ConvNeXt-V2-Tiny as an image encoder, normalised pixels in, the last stage's
feature map (``last_hidden_state``) and the pooled, normalised embedding (``pooler_output``) out.

Depth: the suite's kernel-level L4 tasks are 2 layers deep, but a convnet's layers are not alike:
each stage has its own width and map size (56 x 56 x 96 down to 7 x 7 x 768 at 224 px, from wide
memory-bound maps to small launch-bound ones) and the stages are joined by downsampling layers, so
the cut keeps all four stages, the stem, the three downsampling layers and the head, and cuts only
the blocks per stage (``DEPTHS``), which repeat identically (the real 3-3-9-3). On the full profile
the third stage, which holds half of the real blocks, keeps two, so one block is fed by another
rather than by a downsampling layer; the CPU keeps one a stage.

Full profile: the real widths at 224 px, one image (a request) and batches of 32 and 128, bf16 as
served; float32 (the published checkpoints) on the batch of 32. CPU: ConvNeXt-V2-Atto's widths on a
pair of 66 x 42 px images (16 x 10 after the stem, the 2 pixel rows past the last whole patch
unread, then 8 x 5, 4 x 2 and 2 x 1: odd sides halved rounding down).
"""
import torch
from hypothesis import strategies as st

from fk_pytest import Case, Task, standard_tests
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L4.convnext import ConvNextV2Model

from ..configs import load_config
from ..convnext_workload import MODEL
from ..L1.test_patch_embed import IMAGENET, TASK as PATCH_EMBED_TASK, normalised_images
from ..L3.test_convnext_block import TASK as BLOCK_TASK
from ..workload import HAND_PICKED_WEIGHT

DEPTHS = {"cpu": (1, 1, 1, 1), "full": (1, 1, 2, 1)}
# (height, width, batch) per profile
IMAGES = {"cpu": ((66, 42, 2),), "full": ((224, 224, 1), (224, 224, 32), (224, 224, 128))}
FP32_SWEEP = {"cpu": (), "full": ((224, 224, 32),)}
# The CPU runs ConvNeXt-V2-Atto's stage widths: Tiny's (9 M parameters at this depth) cost the main
# job seconds more in the float64 truth and the copies of the weights; Tiny's widths run in the
# convnext_block task's CPU cases.
CPU_FAMILY = "atto"
# Fuzzed stage widths of the ConvNeXt-V2 family (the CPU keeps atto's) and image sides: served sizes
# (224, 256, 288, 384 px) or any from the smallest with four stages (32 px).
FAMILY_WIDTHS = {"atto": (40, 80, 160, 320), "nano": (80, 160, 320, 640), "tiny": (96, 192, 384, 768),
                 "base": (128, 256, 512, 1024), "large": (192, 384, 768, 1536)}
FUZZ = {"cpu": dict(families=("atto",), depths=(DEPTHS["cpu"],), sides=(32,), max_side=40, max_batch=2),
        "full": dict(families=tuple(FAMILY_WIDTHS), depths=(DEPTHS["cpu"], DEPTHS["full"]), sides=(224, 256, 288, 384),
                     max_side=400, max_batch=8)}


class ConvNextV2ModelTask(Task):
    name = "convnext_model"
    level = 4
    family = "model"
    module_path = "L4/convnext.py"
    reference = ConvNextV2Model
    fuzz_dtypes = ("bf16",)

    def cases(self, profile):
        images = IMAGES[profile]
        weight = 1.0 if profile == "cpu" else 1.0 / len(images)
        return ([self._case(h, w, b, torch.bfloat16, weight, profile) for h, w, b in images]
                + [self._case(h, w, b, torch.float32, HAND_PICKED_WEIGHT, profile) for h, w, b in FP32_SWEEP[profile]])

    def _case(self, height, width, batch, dt, weight, profile):
        cfg = load_config(MODEL)
        dims = tuple(cfg["hidden_sizes"]) if profile == "full" else FAMILY_WIDTHS[CPU_FAMILY]
        size = f"{height}px" if height == width else f"{height}x{width}px"
        depths = "-".join(map(str, DEPTHS[profile]))
        return Case(f"{MODEL}-d{depths}-C{dims[0]}-{size}-B{batch}-{DTYPE_NAMES[dt]}", dt, model=MODEL, weight=weight,
                    params=dict(height=height, width=width, batch=batch, depths=DEPTHS[profile], dims=dims,
                                patch=cfg["patch_size"], kernel=cfg["kernel_size"], mlp_ratio=cfg["mlp_ratio"],
                                eps=cfg["layer_norm_eps"]))

    def config(self, case):
        return dict(hidden_sizes=list(case["dims"]), depths=list(case["depths"]), num_stages=len(case["dims"]),
                    patch_size=case["patch"], num_channels=3, kernel_size=case["kernel"],
                    mlp_ratio=case["mlp_ratio"], layer_norm_eps=case["eps"], hidden_act="gelu")

    def init_args(self, case):
        return {"config": self.config(case)}

    def init_weights(self, module, gen):
        """The stem's and the downsampling layers' filters as the patch_embed task draws them,
        every block as the convnext_block task does, LayerNorm gains near 1 and biases of 0.1."""
        PATCH_EMBED_TASK.init_weights(module.stem.conv, gen)
        norms = [module.stem.norm, module.head_norm]
        for stage in module.stages:
            if stage.downsample is not None:
                PATCH_EMBED_TASK.init_weights(stage.downsample.conv, gen)
                norms.append(stage.downsample.norm)
            for block in stage.blocks:
                BLOCK_TASK.init_weights(block, gen)
        with torch.no_grad():
            for norm in norms:
                dev = norm.weight.device
                norm.weight.copy_(1.0 + 0.2 * torch.randn(norm.weight.shape, generator=gen, device=dev))
                norm.bias.copy_(0.1 * torch.randn(norm.bias.shape, generator=gen, device=dev))

    def make_inputs(self, case, gen, device):
        pixels = normalised_images(case["batch"], 3, case["height"], case["width"], case["patch"], IMAGENET, gen,
                                   device)
        return {"pixel_values": pixels.to(case.dtype)}

    def output_names(self, case):
        return ("last_hidden_state", "pooler_output")

    def fuzz_strategy(self, dtype, profile):
        limits = FUZZ[profile]
        smallest = 8 * load_config(MODEL)["patch_size"]  # one pixel left at the last stage
        sides = st.one_of(st.sampled_from(limits["sides"]), st.integers(smallest, limits["max_side"]))

        @st.composite
        def draw_case(draw):
            family = draw(st.sampled_from(limits["families"]))
            height = draw(sides)
            width = draw(st.one_of(st.just(height), sides))  # square, or a photo's aspect
            depths = draw(st.sampled_from(limits["depths"]))
            params = dict(height=height, width=width, batch=draw(st.integers(1, limits["max_batch"])),
                          depths=depths, dims=FAMILY_WIDTHS[family], patch=4, kernel=7, mlp_ratio=4, eps=1e-6)
            desc = f"{family}-d{'-'.join(map(str, depths))}-{height}x{width}px-B{params['batch']}"
            return Case(f"fuzz-{desc}-{DTYPE_NAMES[dtype]}", dtype, params=params)

        return draw_case()

    def _stage_maps(self, case):
        """(side h, side w, channels) of each stage's map."""
        h, w = case["height"] // case["patch"], case["width"] // case["patch"]
        out = []
        for i, dim in enumerate(case["dims"]):
            if i:
                h, w = h // 2, w // 2
            out.append((h, w, dim))
        return out

    def _weights(self, case) -> int:
        dims, k, ratio = case["dims"], case["kernel"], case["mlp_ratio"]
        block = lambda c: c * (k * k + 1) + 2 * c + 2 * (ratio * c) * c + 3 * ratio * c + c  # noqa: E731
        total = 3 * case["patch"] ** 2 * dims[0] + 3 * dims[0] + 2 * dims[-1]
        for i, (c, depth) in enumerate(zip(dims, case["depths"])):
            total += depth * block(c) + (2 * dims[i - 1] + 4 * dims[i - 1] * c + c if i else 0)
        return total

    def io_bytes(self, case):
        b, (h, w, c) = case["batch"], self._stage_maps(case)[-1]
        activations_io = b * 3 * case["height"] * case["width"] + b * h * w * c + b * c
        return (self._weights(case) + activations_io) * torch.finfo(case.dtype).bits // 8

    def flops(self, case):
        b, k, ratio = case["batch"], case["kernel"], case["mlp_ratio"]
        maps = self._stage_maps(case)
        h0, w0, c0 = maps[0]
        total = h0 * w0 * (2 * 3 * case["patch"] ** 2 * c0 + 7 * c0)  # stem GEMM and LayerNorm
        for i, ((h, w, c), depth) in enumerate(zip(maps, case["depths"])):
            if i:
                c_in = maps[i - 1][2]
                total += h * w * 2 * 4 * c_in * c + 4 * h * w * 6 * c_in  # the 2x2 conv, the norm before it
            per_pixel = (2 * k * k + 1) * c + 6 * c + 4 * c * ratio * c + 6 * ratio * c + 2 * c
            total += depth * h * w * per_pixel
        return b * total


TASK = ConvNextV2ModelTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
