"""Global Response Normalization of ConvNeXt-V2: per image, each channel's L2 norm over the feature
map, divided by the mean norm over channels, scales the features, plus the residual and a bias.

It runs in every block's MLP, on the hidden features after GELU (4 x the stage width, channels
last): ConvNeXt-V2-Tiny at 224 px has 56 x 56 x 384, 28 x 28 x 768, 14 x 14 x 1536 and 7 x 7 x 3072
maps. An embedding / classification server sends one image or a batch of 32.
"""
import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from fk_pytest import Case, Task, standard_tests
from fk_pytest.fuzz import real_or_near
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L1.grn import GlobalResponseNorm

from ..configs import load_config
from ..convnext_workload import MAX_BATCH, MODEL, OTHER_STAGE_WIDTHS, REAL_SIDES, stage_shape
from ..workload import CPU_MAX_ELEMENTS, HAND_PICKED_WEIGHT

# (image px, stage, batch) per profile. CPU: a 56 px image (stage maps 14, 7, 3, 1 px) with the real
# channel counts; the interpreter runs each program in numpy, so a few thousand pixels at most.
IMAGES = {"cpu": ((56, 0, 1), (56, 2, 2)),
          "full": tuple((224, stage, batch) for stage in range(4) for batch in (1, 32))}
# Served in bf16; the published checkpoints are float32 and timm serves them that way by default.
FP32_SWEEP = {"cpu": ((56, 1, 1),), "full": ((224, 0, 1), (224, 3, 32))}


class GlobalResponseNormTask(Task):
    name = "global_response_norm"
    level = 1
    family = "norm"
    module_path = "L1/grn.py"
    reference = GlobalResponseNorm

    def cases(self, profile):
        weight = 1.0 if profile == "cpu" else 1.0 / len(IMAGES["full"])
        out = [self.stage_case(px, s, b, torch.bfloat16, weight) for px, s, b in IMAGES[profile]]
        hand = 1.0 if profile == "cpu" else HAND_PICKED_WEIGHT
        out += [self.stage_case(px, s, b, torch.float32, hand) for px, s, b in FP32_SWEEP[profile]]
        return out

    def stage_case(self, image, stage, batch, dt, weight=1.0):
        side, width = stage_shape(image, stage)
        hidden = load_config(MODEL)["mlp_ratio"] * width
        return Case(f"{MODEL}-{image}px-stage{stage + 1}-{side}x{side}x{hidden}-B{batch}-{DTYPE_NAMES[dt]}", dt,
                    model=MODEL, weight=weight,
                    params=dict(height=side, width=side, channels=hidden, batch=batch,
                                eps=load_config(MODEL)["grn_eps"], source="hand-picked"))

    def init_args(self, case):
        return {"dim": case["channels"], "eps": case["eps"], "channels_last": True}

    def init_weights(self, module, gen):
        """Trained GRNs start at zero and learn gains of either sign, a few tenths; biases a
        tenth of a feature, far above bf16 rounding."""
        with torch.no_grad():
            module.weight.copy_(0.5 * torch.randn(module.weight.shape, generator=gen, device=module.weight.device))
            module.bias.copy_(0.1 * torch.randn(module.bias.shape, generator=gen, device=module.bias.device))

    def make_inputs(self, case, gen, device):
        return {"x": gelu_features(case["batch"], case["height"], case["width"], case["channels"], gen, device)
                .to(case.dtype)}

    def fuzz_strategy(self, dtype, profile):
        widths = sorted({4 * w for w in load_config(MODEL)["hidden_sizes"] + list(OTHER_STAGE_WIDTHS)})

        @st.composite
        def draw_case(draw):
            channels = draw(real_or_near(widths))
            side = draw(st.one_of(st.sampled_from(REAL_SIDES), st.integers(1, 60)))
            other = draw(st.one_of(st.just(side), st.integers(1, 60)))  # square, or a photo's aspect
            batch = draw(st.integers(1, MAX_BATCH[profile]))
            if profile == "cpu":  # keep the interpreter's work small: shrink the map, then the batch
                while side * other * channels > CPU_MAX_ELEMENTS // 16 and max(side, other) > 1:
                    side, other = max(1, side // 2), max(1, other // 2)
                batch = max(1, min(batch, CPU_MAX_ELEMENTS // 16 // (side * other * channels)))
            params = dict(height=side, width=other, channels=channels, batch=batch, eps=1e-6)
            return Case(f"fuzz-{side}x{other}x{channels}-B{batch}-{DTYPE_NAMES[dtype]}", dtype, params=params)

        return draw_case()

    def io_bytes(self, case):
        n = case["batch"] * case["height"] * case["width"] * case["channels"]
        return (2 * n + 2 * case["channels"]) * torch.finfo(case.dtype).bits // 8

    def flops(self, case):
        # square-and-add for the norms; multiply by the per-channel factor, add the bias
        return 4 * case["batch"] * case["height"] * case["width"] * case["channels"]


def gelu_features(batch, height, width, channels, gen, device) -> torch.Tensor:
    """Float32 features like a ConvNeXt MLP's after GELU: each channel its own scale (log-normal,
    so their norms differ by several times, which is what GRN equalises) and its own shift (some
    channels mostly negative, nearly dead after GELU), plus a smooth spatial pattern per image."""
    scale = torch.exp(0.6 * torch.randn((1, 1, 1, channels), generator=gen, device=device))
    shift = 0.8 * torch.randn((1, 1, 1, channels), generator=gen, device=device)
    coarse = torch.randn((batch, channels, 3, 3), generator=gen, device=device)
    pattern = F.interpolate(coarse, size=(height, width), mode="bilinear", align_corners=False).permute(0, 2, 3, 1)
    noise = torch.randn((batch, height, width, channels), generator=gen, device=device)
    # Contiguous [B, H, W, C], as the MLP's fc1 (a Linear) writes them. The sum above takes the
    # permuted pattern's memory order, and the reference then spent 291 of its 382 us copying a
    # batch-32 stage-1 map into order before its two kernels (92 us; H100, 2026-12-05,
    # `python3 -m benchmarks kernel_breakdown global_response_norm --case stage1-56x56x384-B32`).
    return F.gelu(scale * (0.6 * pattern + 0.8 * noise) + shift).contiguous()


TASK = GlobalResponseNormTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
