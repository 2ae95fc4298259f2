"""Dinov2Layer (L3): DINOv2's pre-norm ViT block, attention and GELU MLP each scaled by a per-channel
LayerScale gain before its residual add, over a batch of images [B, S, D].

DINOv2-S/14 at 224 px: 256 patches + the class token = 257 tokens, one image (a request) or 32 (a
batch); bf16 as served, float32 (torch hub) on the batch. The CPU runs a 28 px image (2 x 2 patches)
and a pair of 42 x 28 px images (3 x 2) at the real width (384, 6 heads of 64, MLP 1536).
"""
import torch
from hypothesis import strategies as st

from fk_pytest import Case, Task, standard_tests
from fk_pytest.fuzz import token_counts
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L3.dinov2_layer import Dinov2Layer

from ..configs import load_config
from ..workload import HAND_PICKED_WEIGHT, activations

MODEL = "dinov2-small"
# (batch, tokens) per profile: 1 + patches
IMAGES = {"cpu": ((1, 5), (2, 7)), "full": ((1, 257), (32, 257))}
FP32_SWEEP = {"cpu": (), "full": ((32, 257),)}
# Fuzzed widths: ViT-S (the CPU's only one), ViT-B and ViT-L, each with its heads of 64.
WIDTHS = {"cpu": ((384, 6),), "full": ((384, 6), (768, 12), (1024, 16))}
FUZZ = {"cpu": dict(max_batch=2, max_tokens=10), "full": dict(max_batch=32, max_tokens=1025)}
# LayerScale gains: DINOv2 trains them up from 1e-5; these magnitudes (1e-2 .. 1, a few negative)
# are a chosen spread, not read from a checkpoint: small enough that the branch is a correction
# to the residual, large enough that each branch's numerics still show in the output.
LAYERSCALE_LOG10 = (-2.0, 0.0)
NEGATIVE_GAIN_SHARE = 0.1


class Dinov2LayerTask(Task):
    name = "dinov2_layer"
    level = 3
    family = "layer"
    module_path = "L3/dinov2_layer.py"
    reference = Dinov2Layer
    fuzz_dtypes = ("bf16",)  # served in bf16; float32 is a hand-picked full-profile case

    def cases(self, profile):
        images = IMAGES[profile]
        weight = 1.0 if profile == "cpu" else 1.0 / len(images)
        out = [self._case(b, s, torch.bfloat16, weight) for b, s in images]
        hand = 1.0 if profile == "cpu" else HAND_PICKED_WEIGHT
        return out + [self._case(b, s, torch.float32, hand) for b, s in FP32_SWEEP[profile]]

    def _case(self, batch, tokens, dt, weight):
        cfg = load_config(MODEL)
        return Case(f"{MODEL}-B{batch}-S{tokens}-{DTYPE_NAMES[dt]}", dt, model=MODEL, weight=weight,
                    params=dict(batch=batch, tokens=tokens, hidden=cfg["hidden_size"],
                                heads=cfg["num_attention_heads"], mlp_ratio=cfg["mlp_ratio"],
                                eps=cfg["layer_norm_eps"], act=cfg["hidden_act"]))

    def init_args(self, case):
        return dict(hidden_size=case["hidden"], num_attention_heads=case["heads"], mlp_ratio=case["mlp_ratio"],
                    layer_norm_eps=case["eps"], hidden_act=case["act"])

    def init_weights(self, module, gen):
        """Matrices of trained scale (unit outputs for unit inputs), biases of 0.1, norm gains near 1,
        LayerScale gains log-uniform over ``LAYERSCALE_LOG10`` with a few negative."""
        with torch.no_grad():
            for name, p in module.named_parameters():
                noise = torch.randn(p.shape, generator=gen, device=p.device)
                if name.endswith("lambda1"):
                    low, high = LAYERSCALE_LOG10
                    u = torch.rand(p.shape, generator=gen, device=p.device)
                    sign = torch.where(torch.rand(p.shape, generator=gen, device=p.device) < NEGATIVE_GAIN_SHARE,
                                       -1.0, 1.0)
                    p.copy_(sign * 10.0 ** (low + (high - low) * u))
                elif p.dim() == 2:
                    p.copy_(noise * p.shape[-1] ** -0.5)
                elif name.endswith("bias"):
                    p.copy_(0.1 * noise)
                else:
                    p.copy_(1.0 + 0.2 * noise)

    def make_inputs(self, case, gen, device):
        # the residual stream mid-stack: larger than the normed branch inputs, with outlier channels
        shape = (case["batch"], case["tokens"], case["hidden"])
        return {"hidden_states": activations(shape, gen, device, case.dtype, scale=2.0)}

    def fuzz_strategy(self, dtype, profile):
        limits = FUZZ[profile]

        @st.composite
        def draw_case(draw):
            hidden, heads = draw(st.sampled_from(WIDTHS[profile]))
            b = draw(st.integers(1, limits["max_batch"]))
            s = draw(token_counts(limits["max_tokens"]))
            params = dict(batch=b, tokens=s, hidden=hidden, heads=heads, mlp_ratio=4, eps=1e-6, act="gelu")
            return Case(f"fuzz-B{b}-S{s}-D{hidden}-{DTYPE_NAMES[dtype]}", dtype, params=params)

        return draw_case()

    def _weights(self, case) -> int:
        d, inner = case["hidden"], int(case["hidden"] * case["mlp_ratio"])
        return 4 * d * d + 2 * d * inner

    def io_bytes(self, case):
        activations_io = 2 * case["batch"] * case["tokens"] * case["hidden"]
        return (self._weights(case) + activations_io) * torch.finfo(case.dtype).bits // 8

    def flops(self, case):
        b, s, d = case["batch"], case["tokens"], case["hidden"]
        return 2 * b * s * self._weights(case) + 4 * b * s * s * d


TASK = Dinov2LayerTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
