"""SiglipEncoderLayer (L3): the SigLIP-2 vision tower's pre-norm block (attention, then the tanh-GELU
MLP, each added to the residual as it is: no LayerScale), over a batch of images [B, S, D].

SigLIP-2 so400m/14 at 384 px: 27 x 27 = 729 patch tokens (no class token), one image (a request) or
32 (a batch), bf16 as served; float32 on the batch. The CPU runs a 3 x 3 grid (9 tokens) and a pair
of 2 x 2 grids at the real head size (72) with 2 heads, the MLP narrowed in the real ratio.
"""
import torch
from hypothesis import strategies as st

from fk_pytest import Case, standard_tests
from fk_pytest.fuzz import token_counts
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L3.siglip_encoder_layer import SiglipEncoderLayer

from ..configs import load_config
from ..workload import HAND_PICKED_WEIGHT
from .test_dinov2_layer import Dinov2LayerTask

MODEL = "siglip2-so400m-vision"
# (batch, tokens) per profile
IMAGES = {"cpu": ((1, 9), (2, 4)), "full": ((1, 729), (32, 729))}
FP32_SWEEP = {"cpu": (), "full": ((32, 729),)}
# Fuzzed (hidden, heads, intermediate): so400m (heads of 72), and SigLIP's B/16 and L/16 towers (64)
WIDTHS = {"cpu": ((144, 2, 538),), "full": ((1152, 16, 4304), (768, 12, 3072), (1024, 16, 4096))}
FUZZ = {"cpu": dict(max_batch=2, max_tokens=9), "full": dict(max_batch=32, max_tokens=1025)}


class SiglipEncoderLayerTask(Dinov2LayerTask):
    """DINOv2's block task (weights, residual-stream inputs, byte and FLOP counts) with SigLIP's
    shapes: an explicit MLP width and no LayerScale."""
    name = "siglip_encoder_layer"
    module_path = "L3/siglip_encoder_layer.py"
    reference = SiglipEncoderLayer

    def cases(self, profile):
        images = IMAGES[profile]
        weight = 1.0 if profile == "cpu" else 1.0 / len(images)
        out = [self._case(b, s, torch.bfloat16, weight, profile) for b, s in images]
        return out + [self._case(b, s, torch.float32, HAND_PICKED_WEIGHT, profile) for b, s in FP32_SWEEP[profile]]

    def _case(self, batch, tokens, dt, weight, profile="full"):
        cfg = load_config(MODEL)
        hidden, heads, inter = cfg["hidden_size"], cfg["num_attention_heads"], cfg["intermediate_size"]
        if profile == "cpu":
            hidden, heads, inter = WIDTHS["cpu"][0]
        return Case(f"{MODEL}-B{batch}-S{tokens}-D{hidden}-{DTYPE_NAMES[dt]}", dt, model=MODEL, weight=weight,
                    params=dict(batch=batch, tokens=tokens, hidden=hidden, heads=heads, intermediate=inter,
                                eps=cfg["layer_norm_eps"], act=cfg["hidden_act"]))

    def init_args(self, case):
        return dict(hidden_size=case["hidden"], num_attention_heads=case["heads"],
                    intermediate_size=case["intermediate"], layer_norm_eps=case["eps"], hidden_act=case["act"])

    def fuzz_strategy(self, dtype, profile):
        limits = FUZZ[profile]

        @st.composite
        def draw_case(draw):
            hidden, heads, inter = draw(st.sampled_from(WIDTHS[profile]))
            b = draw(st.integers(1, limits["max_batch"]))
            s = draw(token_counts(limits["max_tokens"]))
            params = dict(batch=b, tokens=s, hidden=hidden, heads=heads, intermediate=inter, eps=1e-6,
                          act="gelu_pytorch_tanh")
            return Case(f"fuzz-B{b}-S{s}-D{hidden}-{DTYPE_NAMES[dtype]}", dtype, params=params)

        return draw_case()

    def _weights(self, case) -> int:
        return 4 * case["hidden"] ** 2 + 2 * case["hidden"] * case["intermediate"]


TASK = SiglipEncoderLayerTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
