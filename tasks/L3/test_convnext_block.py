"""ConvNeXtBlock (L3): ConvNeXt-V2's residual block, the 7x7 depthwise conv and LayerNorm, then the
4x MLP with GELU and Global Response Normalization, added to the block's input; [B, C, H, W] in
and out.

ConvNeXt-V2-Tiny at 224 px runs 18 of them on 56 x 56 x 96, 28 x 28 x 192, 14 x 14 x 384 and
7 x 7 x 768 maps; a classification or embedding server sends batches of 32 to 128 images. Blocks
see their input in channels-last memory (timm and HF both hand one block's output to the next in
that layout, see the reference), so the cases are channels-last, bf16 as served; a packed NCHW map
(a caller that made its features contiguous) and the float32 of the published checkpoints are
hand-picked. The CPU runs a 56 px image's stages (14, 7 and 3 pixels a side) at the real widths.
"""
import torch
from hypothesis import strategies as st

from fk_pytest import Case, Task, standard_tests
from fk_pytest.fuzz import real_or_near
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L3.convnext_block import ConvNeXtBlock

from ..configs import load_config
from ..convnext_workload import MAX_BATCH, MODEL, OTHER_STAGE_WIDTHS, REAL_SIDES, stage_shape
from ..L1.test_convnext_dwconv_norm import TASK as DWCONV_TASK, feature_map_inputs
from ..L1.test_global_response_norm import TASK as GRN_TASK
from ..workload import CPU_MAX_ELEMENTS, HAND_PICKED_WEIGHT

CHANNELS_LAST, NCHW = "channels-last", "contiguous"
# (image px, stage index, batch, layout) per profile
IMAGES = {"cpu": ((56, 0, 1, CHANNELS_LAST), (56, 2, 2, NCHW)),
          "full": tuple((224, stage, batch, CHANNELS_LAST) for stage in range(4) for batch in (32, 128))}
HAND_PICKED = {"cpu": (), "full": ((224, 0, 32, NCHW),)}
FP32_SWEEP = {"cpu": ((56, 1, 1, CHANNELS_LAST),),
              "full": ((224, 0, 32, CHANNELS_LAST), (224, 3, 128, CHANNELS_LAST))}
# The fuzz keeps the MLP's hidden map (4 x the block's) to this many elements: on the CPU the Triton
# interpreter runs the example tree's GELU and GRN program by program; on the GPU the float64 truth
# holds several copies of it (2^28 elements: 2 GB each).
FUZZ_HIDDEN = {"cpu": CPU_MAX_ELEMENTS // 8, "full": 1 << 28}


class ConvNeXtBlockTask(Task):
    name = "convnext_block"
    level = 3
    family = "layer"
    module_path = "L3/convnext_block.py"
    reference = ConvNeXtBlock
    fuzz_dtypes = ("bf16",)  # served in bf16; float32 is hand-picked

    def cases(self, profile):
        weight = 1.0 if profile == "cpu" else 1.0 / len(IMAGES["full"])
        hand = 1.0 if profile == "cpu" else HAND_PICKED_WEIGHT
        return ([self.stage_case(*image, torch.bfloat16, weight) for image in IMAGES[profile]]
                + [self.stage_case(*image, torch.bfloat16, hand) for image in HAND_PICKED[profile]]
                + [self.stage_case(*image, torch.float32, hand) for image in FP32_SWEEP[profile]])

    def stage_case(self, image, stage, batch, layout, dt, weight):
        side, width = stage_shape(image, stage)
        cfg = load_config(MODEL)
        suffix = "-nchw" if layout == NCHW else ""
        return Case(f"{MODEL}-{image}px-stage{stage + 1}-{width}x{side}x{side}-B{batch}{suffix}-{DTYPE_NAMES[dt]}",
                    dt, model=MODEL, weight=weight,
                    params=dict(height=side, width=side, channels=width, batch=batch, layout=layout,
                                kernel=cfg["kernel_size"], mlp_ratio=cfg["mlp_ratio"], eps=cfg["layer_norm_eps"]))

    def init_args(self, case):
        return dict(in_chs=case["channels"], kernel_size=case["kernel"], mlp_ratio=case["mlp_ratio"], eps=case["eps"])

    def init_weights(self, module, gen):
        """The depthwise filters and LayerNorm as the convnext_dwconv_norm task draws them, GRN's
        gains and biases as the global_response_norm task does; the two Linears of unit gain
        (unit outputs for unit inputs) with biases of 0.1, so the branch is as large as the
        residual stream and neither can be dropped unseen."""
        DWCONV_TASK.init_weights(module.conv_dw_norm, gen)
        GRN_TASK.init_weights(module.mlp.grn, gen)
        with torch.no_grad():
            for linear in (module.mlp.fc1, module.mlp.fc2):
                dev = linear.weight.device
                linear.weight.copy_(torch.randn(linear.weight.shape, generator=gen, device=dev)
                                    * linear.weight.shape[1] ** -0.5)
                linear.bias.copy_(0.1 * torch.randn(linear.bias.shape, generator=gen, device=dev))

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
            budget = FUZZ_HIDDEN[profile]
            if profile == "cpu":  # shrink the map to the interpreter's budget
                while 4 * side * other * channels > budget and max(side, other) > 1:
                    side, other = max(1, side // 2), max(1, other // 2)
            batch = max(1, min(batch, budget // (4 * side * other * channels)))
            layout = draw(st.sampled_from([CHANNELS_LAST, CHANNELS_LAST, NCHW]))
            params = dict(height=side, width=other, channels=channels, batch=batch, layout=layout, kernel=7,
                          mlp_ratio=4, eps=1e-6)
            return Case(f"fuzz-{channels}x{side}x{other}-B{batch}-{layout}-{DTYPE_NAMES[dtype]}", dtype,
                        params=params)

        return draw_case()

    def _params(self, case) -> int:
        c, hidden, k = case["channels"], case["mlp_ratio"] * case["channels"], case["kernel"]
        return c * (k * k + 1) + 2 * c + (c + 1) * hidden + 2 * hidden + (hidden + 1) * c

    def io_bytes(self, case):
        n = case["batch"] * case["height"] * case["width"] * case["channels"]
        return (2 * n + self._params(case)) * torch.finfo(case.dtype).bits // 8

    def flops(self, case):
        pixels = case["batch"] * case["height"] * case["width"]
        c, hidden, k = case["channels"], case["mlp_ratio"] * case["channels"], case["kernel"]
        # taps and bias, LayerNorm, the two GEMMs with biases, GRN (square-add, scale, shift), residual
        per_pixel = (2 * k * k + 1) * c + 6 * c + 4 * c * hidden + hidden + c + 4 * hidden + c
        return pixels * per_pixel


TASK = ConvNeXtBlockTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
