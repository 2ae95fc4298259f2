"""Dinov2MLP (L2): a ViT-style encoder block's MLP, ``fc2(gelu(fc1(x)))`` over a batch of images
[B, S, D], the input being the block's second LayerNorm output.

The two vision towers of the suite, each at its L3 block task's image batches: DINOv2-S/14 at 224 px
(257 tokens; 384 -> 1536, exact GELU) and SigLIP-2 so400m/14 at 384 px (729 tokens; 1152 -> 4304,
tanh GELU: vLLM's and HF's ``SiglipMLP``, the same module), one image and a batch of 32 in bf16 as
served, the batch again in float32. The CPU runs the L3 tasks' small grids at DINOv2's real width and
SigLIP's narrowed one. Fuzzing draws both activations over ViT-S/B/L and so400m widths.
"""
import torch
from hypothesis import strategies as st

from fk_pytest import Case, Task, standard_tests
from fk_pytest.fuzz import token_counts
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L2.vit_mlp import Dinov2MLP

from ..configs import load_config
from ..L3 import test_dinov2_layer as dinov2
from ..L3 import test_siglip_encoder_layer as siglip
from ..workload import HAND_PICKED_WEIGHT, activations

# (hidden, intermediate, activation) fuzzed: ViT-S/B/L with MLP ratio 4 (DINOv2) and so400m
WIDTHS = {"cpu": ((384, 1536, "gelu"), (144, 538, "gelu_pytorch_tanh")),
          "full": ((384, 1536, "gelu"), (768, 3072, "gelu"), (1024, 4096, "gelu"),
                   (1152, 4304, "gelu_pytorch_tanh"))}
FUZZ = {"cpu": dict(max_batch=2, max_tokens=9), "full": dict(max_batch=32, max_tokens=1025)}


def tower_widths(model: str, profile: str):
    """(hidden, intermediate, activation) of a tower's MLP; the CPU's SigLIP is its L3 task's cut."""
    cfg = load_config(model)
    if model == siglip.MODEL:
        hidden, inter = cfg["hidden_size"], cfg["intermediate_size"]
        if profile == "cpu":
            hidden, _, inter = siglip.WIDTHS["cpu"][0]
        return hidden, inter, cfg["hidden_act"]
    return cfg["hidden_size"], int(cfg["hidden_size"] * cfg["mlp_ratio"]), cfg["hidden_act"]


class VitMLPTask(Task):
    name = "vit_mlp"
    level = 2
    family = "mlp"
    module_path = "L2/vit_mlp.py"
    reference = Dinov2MLP
    fuzz_dtypes = ("bf16",)  # served in bf16; float32 is a hand-picked full-profile case
    init_weights = dinov2.Dinov2LayerTask.init_weights  # trained-scale matrices, biases of 0.1

    def cases(self, profile):
        out = []
        for tower in (dinov2, siglip):
            images = tower.IMAGES[profile]
            weight = 1.0 if profile == "cpu" else 1.0 / len(images)
            out += [self._case(tower.MODEL, profile, b, s, torch.bfloat16, weight) for b, s in images]
            hand = 1.0 if profile == "cpu" else HAND_PICKED_WEIGHT
            out += [self._case(tower.MODEL, profile, b, s, torch.float32, hand) for b, s in tower.FP32_SWEEP[profile]]
        return out

    def _case(self, model, profile, batch, tokens, dt, weight):
        hidden, inter, act = tower_widths(model, profile)
        return Case(f"{model}-B{batch}-S{tokens}-D{hidden}-{DTYPE_NAMES[dt]}", dt, model=model, weight=weight,
                    params=dict(batch=batch, tokens=tokens, hidden=hidden, intermediate=inter, act=act))

    def init_args(self, case):
        return dict(hidden_size=case["hidden"], intermediate_size=case["intermediate"], hidden_act=case["act"])

    def make_inputs(self, case, gen, device):
        # the block's second LayerNorm output: unit scale, with outlier channels
        shape = (case["batch"], case["tokens"], case["hidden"])
        return {"hidden_states": activations(shape, gen, device, case.dtype)}

    def fuzz_strategy(self, dtype, profile):
        limits = FUZZ[profile]

        @st.composite
        def draw_case(draw):
            hidden, inter, act = draw(st.sampled_from(WIDTHS[profile]))
            b = draw(st.integers(1, limits["max_batch"]))
            s = draw(token_counts(limits["max_tokens"]))
            params = dict(batch=b, tokens=s, hidden=hidden, intermediate=inter, act=act)
            return Case(f"fuzz-B{b}-S{s}-D{hidden}-{act}-{DTYPE_NAMES[dtype]}", dtype, params=params)

        return draw_case()

    def io_bytes(self, case):
        rows, d, inner = case["batch"] * case["tokens"], case["hidden"], case["intermediate"]
        return (2 * d * inner + 2 * rows * d) * torch.finfo(case.dtype).bits // 8

    def flops(self, case):
        return 2 * case["batch"] * case["tokens"] * 2 * case["hidden"] * case["intermediate"]


TASK = VitMLPTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
