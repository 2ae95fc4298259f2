"""PatchEmbed: a vision transformer's first op, p x p patches of normalised pixels projected to tokens.

Embedding serving sends one image or a batch of 32: DINOv2-S/14 at 224 px (16 x 16 patches) and at
448 px (32 x 32), SigLIP-2 so400m/14 at 384 px (27 x 27 = 729 patches, 1152 wide), DINOv3 ViT-L/16
at 224 px, at 512 px and, for dense features, a 480 x 640 photo kept at its aspect ratio (30 x 40).
Pixels look like a photo after the model's image processor (ImageNet mean/std for DINO, 0.5/0.5 for
SigLIP): smooth regions and edges plus grain, not white noise, so the patch order and the weight
layout are both visible in the output.
"""
import math

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from fk_pytest import Case, Task, standard_tests
from fk_pytest.fuzz import real_or_near
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L1.patch_embed import PatchEmbed

from ..configs import load_config
from ..workload import HAND_PICKED_WEIGHT

# (height, width, batch) per model and profile. CPU: grids of 2 x 2 to 3 x 3 patches (the truth and
# both sides are GEMMs of a few rows; the widths stay real); SigLIP's 48 px leaves 6 pixels past its
# last whole patch, as its native 384 px does (27 x 14 = 378).
IMAGES = {
    "cpu": {"dinov2-small": ((28, 28, 2),), "siglip2-so400m-vision": ((48, 48, 1),),
            "dinov3-vitl16": ((32, 48, 1),)},
    "full": {"dinov2-small": ((224, 224, 1), (224, 224, 32), (448, 448, 1), (448, 448, 32)),
             "siglip2-so400m-vision": ((384, 384, 1), (384, 384, 32)),
             "dinov3-vitl16": ((224, 224, 1), (224, 224, 32), (512, 512, 1), (512, 512, 32), (480, 640, 1))},
}
# Served in bf16; torch hub's DINOv2 runs float32, swept at a few sizes. Preprocessing on the GPU
# (torchvision / DALI) may hand the images over channels-last: DINOv3's CPU case comes that way, and
# the full profile adds its 224 px batch of 32 channels-last.
FP32_SWEEP = {"cpu": {"dinov2-small": ((28, 42, 1),)}, "full": {"dinov2-small": ((224, 224, 1), (224, 224, 32))}}
CHANNELS_LAST_MODEL, CHANNELS_LAST_FULL = "dinov3-vitl16", (224, 224, 32)
# (mean, std) of each model's image processor; pixels in [0, 1] are normalised with them.
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
NORMALISATION = {"dinov2-small": IMAGENET, "dinov3-vitl16": IMAGENET,
                 "siglip2-so400m-vision": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))}
MODELS = tuple(IMAGES["full"])
# Fuzz: the patch sizes of real ViTs (14: DINOv2 / SigLIP, 16: ViT-B/16 / DINOv3, 8: DINO ViT-S/8),
# grid sides of real images (16 / 32: 224 / 448 px at 14; 27: SigLIP 384 px; 37: DINOv2's 518 px),
# and sometimes pixels past the last whole patch (SigLIP's 384 px at 14 leaves 6).
PATCH_SIZES = (14, 16, 8)
REAL_GRID_SIDES = (16, 27, 32, 37)
MAX_GRID_SIDE = {"cpu": 4, "full": 40}
MAX_BATCH = {"cpu": 2, "full": 8}
OTHER_REAL_WIDTHS = (192, 768, 1280, 1536)  # ViT-Ti, ViT-B, ViT-H, DINOv2-g


class PatchEmbedTask(Task):
    name = "patch_embed"
    level = 1
    family = "embedding"
    module_path = "L1/patch_embed.py"
    reference = PatchEmbed

    def cases(self, profile):
        out = []
        for model, images in IMAGES[profile].items():
            weight = 1.0 if profile == "cpu" else 1.0 / len(images)  # 1 per model
            layout = "channels-last" if profile == "cpu" and model == CHANNELS_LAST_MODEL else "contiguous"
            for h, w, b in images:
                out.append(self.image_case(model, h, w, b, torch.bfloat16, weight, layout))
        hand = 1.0 if profile == "cpu" else HAND_PICKED_WEIGHT
        for model, images in FP32_SWEEP[profile].items():
            for h, w, b in images:
                out.append(self.image_case(model, h, w, b, torch.float32, hand, "contiguous"))
        if profile == "full":
            h, w, b = CHANNELS_LAST_FULL
            out.append(self.image_case(CHANNELS_LAST_MODEL, h, w, b, torch.bfloat16, hand, "channels-last"))
        return out

    def image_case(self, model, height, width, batch, dt, weight=1.0, layout="contiguous"):
        cfg = load_config(model)
        size = f"{height}px" if height == width else f"{height}x{width}px"
        suffix = "-channels-last" if layout == "channels-last" else ""
        return Case(f"{model}-{size}-B{batch}{suffix}-{DTYPE_NAMES[dt]}", dt, model=model, weight=weight,
                    params=dict(patch=cfg["patch_size"], height=height, width=width, batch=batch,
                                in_chans=cfg.get("num_channels", 3), embed_dim=cfg["hidden_size"],
                                img_size=cfg["image_size"], layout=layout, pixels=model, source="hand-picked"))

    def init_args(self, case):
        return {"img_size": case["img_size"], "patch_size": case["patch"], "in_chans": case["in_chans"],
                "embed_dim": case["embed_dim"]}

    def init_weights(self, module, gen):
        """Filters like a trained patch embedding's: smooth colour-weighted spatial patterns plus
        some high-frequency detail, nearly zero-mean, each of norm 0.6 (tokens of RMS 1-2 on
        these images); a bias of 4-10% of a token, far above bf16 rounding (dropping it must show)."""
        weight, bias = module.proj.weight, module.proj.bias
        d, c, ph, pw = weight.shape
        dev = weight.device
        with torch.no_grad():
            coarse = torch.randn((d, 1, 3, 3), generator=gen, device=dev)
            shape = F.interpolate(coarse, size=(ph, pw), mode="bicubic", align_corners=True)
            colour = torch.randn((d, c, 1, 1), generator=gen, device=dev)
            filt = shape * colour + 0.3 * torch.randn((d, c, ph, pw), generator=gen, device=dev)
            filt = filt - 0.9 * filt.mean(dim=(1, 2, 3), keepdim=True)
            filt = filt / filt.flatten(1).norm(dim=1).view(d, 1, 1, 1)
            weight.copy_(0.6 * filt)
            if bias is not None:
                bias.copy_(0.2 * torch.randn(bias.shape, generator=gen, device=dev))

    def make_inputs(self, case, gen, device):
        x = normalised_images(case["batch"], case["in_chans"], case["height"], case["width"], case["patch"],
                              NORMALISATION[case["pixels"]], gen, device).to(case.dtype)
        if case["layout"] == "channels-last":
            x = x.contiguous(memory_format=torch.channels_last)
        return {"x": x}

    def fuzz_strategy(self, dtype, profile):
        widths = sorted({load_config(m)["hidden_size"] for m in MODELS} | set(OTHER_REAL_WIDTHS))
        top = MAX_GRID_SIDE[profile]
        sides = st.one_of(st.sampled_from([s for s in REAL_GRID_SIDES if s <= top] or [top]), st.integers(1, top))

        @st.composite
        def draw_case(draw):
            patch = draw(st.sampled_from(PATCH_SIZES))
            rows = draw(sides)
            cols = draw(st.one_of(st.just(rows), sides))  # square, or a photo's aspect ratio
            spare = st.one_of(st.just(0), st.integers(1, patch - 1))
            params = dict(patch=patch, height=rows * patch + draw(spare), width=cols * patch + draw(spare),
                          batch=draw(st.integers(1, MAX_BATCH[profile])), in_chans=3,
                          embed_dim=draw(real_or_near(widths)), img_size=224,
                          layout=draw(st.sampled_from(["contiguous", "contiguous", "channels-last"])),
                          pixels=draw(st.sampled_from(MODELS)))
            desc = (f"p{patch}-{params['height']}x{params['width']}-B{params['batch']}-D{params['embed_dim']}"
                    f"-{params['layout']}")
            return Case(f"fuzz-{desc}-{DTYPE_NAMES[dtype]}", dtype, params=params)

        return draw_case()

    def io_bytes(self, case):
        b, c, d = case["batch"], case["in_chans"], case["embed_dim"]
        tokens, patch_vec = _tokens(case), c * case["patch"] ** 2
        elements = b * tokens * patch_vec + d * patch_vec + d + b * tokens * d  # pixels past the grid unread
        return elements * torch.finfo(case.dtype).bits // 8

    def flops(self, case):
        return 2 * case["batch"] * _tokens(case) * case["in_chans"] * case["patch"] ** 2 * case["embed_dim"]


def _tokens(case) -> int:
    return (case["height"] // case["patch"]) * (case["width"] // case["patch"])


def normalised_images(batch, channels, height, width, patch, normalisation, gen, device) -> torch.Tensor:
    """Photo-like pixels in [0, 1] (a smooth field varying over a couple of patches, finer detail,
    sensor grain; colour channels correlated; contrast as a photo's, std about 0.25 with a few
    percent clipped), then ``(pixel - mean) / std`` as the model's image processor does."""
    def field(cell):
        grid = (max(2, math.ceil(height / cell)) + 1, max(2, math.ceil(width / cell)) + 1)
        shared = torch.rand((batch, 1) + grid, generator=gen, device=device)
        tint = torch.rand((batch, channels) + grid, generator=gen, device=device)
        return F.interpolate(0.7 * shared + 0.3 * tint, size=(height, width), mode="bilinear", align_corners=True)

    base = 0.8 * field(2 * patch) + 0.2 * field(patch / 3)
    grain = torch.randn((batch, channels, height, width), generator=gen, device=device)
    pixels = (0.5 + 2.2 * (base - 0.5) + 0.03 * grain).clamp(0.0, 1.0)
    mean, std = (torch.tensor(v, device=device).view(1, channels, 1, 1) for v in normalisation)
    return (pixels - mean) / std


TASK = PatchEmbedTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
