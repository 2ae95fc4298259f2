"""The first half of a ConvNeXt(-V2) block: 7x7 depthwise convolution, then LayerNorm over the
channels of each pixel, the output channels-last for the MLP.

ConvNeXt-V2-Tiny at 224 px runs it on 56 x 56 x 96, 28 x 28 x 192, 14 x 14 x 384 and 7 x 7 x 768
feature maps (18 blocks); one image or a batch of 32, the images NCHW as timm builds the model, or
channels-last when the server moved the model to that memory format (the fast layout on GPUs).
"""
import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from fk_pytest import Case, Task, standard_tests
from fk_pytest.fuzz import real_or_near
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L1.convnext_dwconv import ConvNeXtDwConvNorm

from ..configs import load_config
from ..convnext_workload import MAX_BATCH, MODEL, OTHER_STAGE_WIDTHS, REAL_SIDES, stage_shape
from ..workload import CPU_MAX_ELEMENTS, HAND_PICKED_WEIGHT

# (image px, stage, batch, layout) per profile. CPU: a 56 px image (stage maps 14, 7, 3, 1 px), the
# real widths; the channels-last case is the one where a kernel that assumes NCHW strides misreads.
IMAGES = {"cpu": ((56, 0, 1, "contiguous"), (56, 1, 2, "channels-last")),
          "full": tuple((224, stage, batch, "contiguous") for stage in range(4) for batch in (1, 32))}
# Hand-picked: channels-last batches of 32 at every stage (models served in that format), and the
# float32 sweep (the published checkpoints are float32; timm serves them so by default).
CHANNELS_LAST_FULL = tuple((224, stage, 32, "channels-last") for stage in range(4))
FP32_SWEEP = {"cpu": ((56, 2, 1, "contiguous"),),
              "full": ((224, 0, 1, "contiguous"), (224, 3, 32, "channels-last"))}


class ConvNeXtDwConvNormTask(Task):
    name = "convnext_dwconv_norm"
    level = 1
    family = "conv"
    module_path = "L1/convnext_dwconv.py"
    reference = ConvNeXtDwConvNorm

    def cases(self, profile):
        weight = 1.0 if profile == "cpu" else 1.0 / len(IMAGES["full"])
        out = [self.stage_case(*image, torch.bfloat16, weight) for image in IMAGES[profile]]
        hand = 1.0 if profile == "cpu" else HAND_PICKED_WEIGHT
        if profile == "full":
            out += [self.stage_case(*image, torch.bfloat16, hand) for image in CHANNELS_LAST_FULL]
        out += [self.stage_case(*image, torch.float32, hand) for image in FP32_SWEEP[profile]]
        return out

    def stage_case(self, image, stage, batch, layout, dt, weight=1.0):
        side, width = stage_shape(image, stage)
        cfg = load_config(MODEL)
        suffix = "-channels-last" if layout == "channels-last" else ""
        return Case(f"{MODEL}-{image}px-stage{stage + 1}-{width}x{side}x{side}-B{batch}{suffix}-{DTYPE_NAMES[dt]}",
                    dt, model=MODEL, weight=weight,
                    params=dict(height=side, width=side, channels=width, batch=batch, layout=layout,
                                kernel=cfg["kernel_size"], eps=cfg["layer_norm_eps"], source="hand-picked"))

    def init_args(self, case):
        return {"dim": case["channels"], "kernel_size": case["kernel"], "eps": case["eps"]}

    def init_weights(self, module, gen):
        """Depthwise filters like trained ones: a smooth blob of random sign and size per channel
        plus finer detail, an L2 norm of about 1; conv biases and LayerNorm biases of a tenth,
        gains around 1 (dropping or misplacing any of them shows above bf16 rounding)."""
        conv, norm = module.conv_dw, module.norm
        c, _, k, _ = conv.weight.shape
        dev = conv.weight.device
        with torch.no_grad():
            coarse = torch.randn((c, 1, 3, 3), generator=gen, device=dev)
            blob = F.interpolate(coarse, size=(k, k), mode="bicubic", align_corners=True)
            filt = blob + 0.4 * torch.randn((c, 1, k, k), generator=gen, device=dev)
            conv.weight.copy_(filt / filt.flatten(1).norm(dim=1).view(c, 1, 1, 1))
            if conv.bias is not None:
                conv.bias.copy_(0.1 * torch.randn(conv.bias.shape, generator=gen, device=dev))
            norm.weight.copy_(1.0 + 0.2 * torch.randn(norm.weight.shape, generator=gen, device=dev))
            norm.bias.copy_(0.1 * torch.randn(norm.bias.shape, generator=gen, device=dev))

    def make_inputs(self, case, gen, device):
        return feature_map_inputs(case, gen, device)

    def fuzz_strategy(self, dtype, profile):
        widths = sorted(set(load_config(MODEL)["hidden_sizes"]) | set(OTHER_STAGE_WIDTHS))

        @st.composite
        def draw_case(draw):
            channels = draw(real_or_near(widths))
            side = draw(st.one_of(st.sampled_from(REAL_SIDES), st.integers(1, 60)))
            other = draw(st.one_of(st.just(side), st.integers(1, 60)))  # square, or a photo's aspect
            batch = draw(st.integers(1, MAX_BATCH[profile]))
            if profile == "cpu":  # the truth and both sides are float32/64 convolutions: keep them small
                while side * other * channels > CPU_MAX_ELEMENTS // 8 and max(side, other) > 1:
                    side, other = max(1, side // 2), max(1, other // 2)
                batch = max(1, min(batch, CPU_MAX_ELEMENTS // 8 // (side * other * channels)))
            layout = draw(st.sampled_from(["contiguous", "channels-last"]))
            params = dict(height=side, width=other, channels=channels, batch=batch, layout=layout, kernel=7,
                          eps=1e-6)
            return Case(f"fuzz-{channels}x{side}x{other}-B{batch}-{layout}-{DTYPE_NAMES[dtype]}", dtype,
                        params=params)

        return draw_case()

    def io_bytes(self, case):
        n = case["batch"] * case["height"] * case["width"] * case["channels"]
        params = case["channels"] * (case["kernel"] ** 2 + 3)
        return (2 * n + params) * torch.finfo(case.dtype).bits // 8

    def flops(self, case):
        n = case["batch"] * case["height"] * case["width"] * case["channels"]
        return (2 * case["kernel"] ** 2 + 1) * n + 6 * n  # the taps and the bias, then the LayerNorm


def feature_maps(batch, channels, height, width, gen, device) -> torch.Tensor:
    """Float32 feature maps like a ConvNeXt stage's residual stream: per channel a scale and an
    offset (the stream is not centred), smooth spatial structure plus detail, so neighbouring
    pixels correlate and a shifted or mirrored filter gives a different answer."""
    scale = torch.exp(0.5 * torch.randn((1, channels, 1, 1), generator=gen, device=device))
    offset = 0.5 * torch.randn((1, channels, 1, 1), generator=gen, device=device)
    coarse = torch.randn((batch, channels, 4, 4), generator=gen, device=device)
    smooth = F.interpolate(coarse, size=(height, width), mode="bilinear", align_corners=False)
    detail = torch.randn((batch, channels, height, width), generator=gen, device=device)
    return scale * (smooth + 0.5 * detail) + offset


TASK = ConvNeXtDwConvNormTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)


def feature_map_inputs(case, gen, device) -> dict:
    """``{"x": feature maps}`` of the case's size and dtype, channels-last in memory when its layout
    says so (a ConvNeXt block's input, as its depthwise conv's)."""
    x = feature_maps(case["batch"], case["channels"], case["height"], case["width"], gen, device).to(case.dtype)
    if case["layout"] == "channels-last":
        x = x.contiguous(memory_format=torch.channels_last)
    return {"x": x}
