"""GELU (``nn.GELU``): the activation of encoder MLPs, exact (erf) or tanh-approximate, plain and
with the intermediate dense's bias fused in.

Its input is the intermediate projection's output, [T, intermediate] (hidden x 4: 1536 for
MiniLM-L6 and DINOv2-S, 4096 for BGE-M3, 4304 for SigLIP's so400m tower), over the same
embedding-serving token counts as the encoders' LayerNorm. "plain" is ``nn.GELU`` after a dense
that added its bias; "bias" is the fused epilogue, ``gelu(x + bias)`` with the bias unrounded.
"""
import torch
from hypothesis import strategies as st

from fk_pytest import Case, Task, standard_tests
from fk_pytest.fuzz import real_or_near, token_counts
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L1.gelu import GELU, gelu_approximation

from ..configs import load_config
from ..encoder_workload import token_cases
from ..workload import activations, fuzz_cap

MODELS = ("all-minilm-l6-v2", "bge-m3", "dinov2-small", "siglip2-so400m-vision")
VARIANTS = ("plain", "bias")
OTHER_REAL_WIDTHS = (3072, 5120, 1200)  # BERT-base / ViT-B, ViT-H, TinyBERT-4L


def intermediate_size(model: str) -> int:
    cfg = load_config(model)
    return cfg.get("intermediate_size") or cfg["hidden_size"] * cfg["mlp_ratio"]  # DINOv2 states a ratio


class GELUTask(Task):
    name = "gelu"
    level = 1
    family = "activation"
    module_path = "L1/gelu.py"
    reference = GELU

    def cases(self, profile):
        return token_cases(profile, VARIANTS, self._case, MODELS)

    def _case(self, model, phase, t, variant, dt, weight):
        approximate = gelu_approximation(load_config(model)["hidden_act"])
        form = "erf" if approximate == "none" else "tanh"
        suffix = "" if variant == "plain" else f"-{variant}"
        return Case(f"{model}-{phase}-T{t}-{form}{suffix}-{DTYPE_NAMES[dt]}", dt, model=model, weight=weight,
                    params=dict(tokens=t, width=intermediate_size(model), approximate=approximate, variant=variant,
                                layout="contiguous", source="hand-picked"))

    def init_args(self, case):
        return {"approximate": case["approximate"]}

    def make_inputs(self, case, gen, device):
        t, n = case["tokens"], case["width"]
        # Pre-activations spread over GELU's curved region (|x| < 3) with outlier channels in the
        # linear one; dense biases of a few tenths, large enough against bf16 that dropping one shows.
        if case["layout"] == "row-padded":  # rows of a wider buffer (e.g. a slice of a fused output)
            x = activations((t, n + case["pad"]), gen, device, case.dtype, scale=1.5)[:, :n]
        else:
            x = activations((t, n), gen, device, case.dtype, scale=1.5)
        bias = None
        if case["variant"] == "bias":
            bias = (0.2 * torch.randn(n, generator=gen, device=device)).to(case.dtype)
        return {"x": x, "bias": bias}

    def fuzz_strategy(self, dtype, profile):
        widths = sorted({intermediate_size(m) for m in MODELS} | set(OTHER_REAL_WIDTHS))

        @st.composite
        def draw_case(draw):
            # odd small widths too; at least 8 elements, so no draw is all far tail (a zero truth)
            width = draw(st.one_of(real_or_near(widths), st.integers(8, 300)))
            layout = draw(st.sampled_from(["contiguous", "row-padded"]))
            params = dict(tokens=fuzz_cap(draw(token_counts(1024)), width, profile), width=width,
                          approximate=draw(st.sampled_from(["none", "tanh"])),
                          variant=draw(st.sampled_from(list(VARIANTS))), layout=layout)
            if layout == "row-padded":
                params["pad"] = draw(st.sampled_from([8, 64, width]))
            desc = "-".join(f"{k}{v}" for k, v in params.items())
            return Case(f"fuzz-{desc}-{DTYPE_NAMES[dtype]}", dtype, params=params)

        return draw_case()

    def io_bytes(self, case):
        n = case["tokens"] * case["width"]
        bias = case["width"] if case["variant"] == "bias" else 0
        return (2 * n + bias) * torch.finfo(case.dtype).bits // 8

    def flops(self, case):
        # About a dozen per element: erf (a rational approximation) or the cubic and exp of the
        # tanh form count for about eight, the scalings, the product with x and the bias add for the rest.
        return 12 * case["tokens"] * case["width"]


TASK = GELUTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
