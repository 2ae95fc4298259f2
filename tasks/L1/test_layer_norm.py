"""LayerNorm (``nn.LayerNorm`` with weight and bias) of encoders: plain and with the residual add fused in.

Embedding and vision encoders run it on every token of a batch at once: BERT-style text encoders
(all-MiniLM-L6-v2, BGE-M3 / XLM-R large) as post-norm "add & norm" after attention and MLP (plus a
plain norm on the embeddings), pre-norm ViTs (DINOv2, SigLIP-2's so400m tower) before each block,
where a fused kernel folds the previous block's residual add in. Token counts are those of an
embedding-serving batch (tasks/encoder_workload.py).
"""
import torch
from hypothesis import strategies as st

from fk_pytest import Case, Task, standard_tests
from fk_pytest.fuzz import real_or_near, token_counts
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L1.layer_norm import LayerNorm

from ..configs import load_config
from ..encoder_workload import TEXT_MODELS, VISION_MODELS, token_cases
from ..workload import activations, fuzz_cap

VARIANTS = ("plain", "fused-add")
OTHER_REAL_WIDTHS = (768, 1024, 1536, 312, 512)  # BERT-base / ViT-B, large, DINOv2-g, TinyBERT, ...


class LayerNormTask(Task):
    name = "layer_norm"
    level = 1
    family = "norm"
    module_path = "L1/layer_norm.py"
    reference = LayerNorm

    def cases(self, profile):
        return token_cases(profile, VARIANTS, self._case)

    def _case(self, model, phase, t, variant, dt, weight):
        cfg = load_config(model)
        suffix = "" if variant == "plain" else f"-{variant}"
        return Case(f"{model}-{phase}-T{t}{suffix}-{DTYPE_NAMES[dt]}", dt, model=model, weight=weight,
                    params=dict(tokens=t, hidden=cfg["hidden_size"], eps=cfg["layer_norm_eps"], variant=variant,
                                layout="contiguous", residual_scale=1.0 if model in TEXT_MODELS else 4.0,
                                source="hand-picked"))

    def init_args(self, case):
        return {"hidden_size": case["hidden"], "eps": case["eps"]}

    def init_weights(self, module, gen):
        """Gains around 1 and biases around 0, as trained LayerNorms have; a bias large enough
        against the bf16 rounding that dropping it is seen."""
        with torch.no_grad():
            module.weight.copy_(1.0 + 0.2 * torch.randn(module.weight.shape, generator=gen, device=module.weight.device))
            module.bias.copy_(0.1 * torch.randn(module.bias.shape, generator=gen, device=module.bias.device))

    def make_inputs(self, case, gen, device):
        t, h = case["tokens"], case["hidden"]
        if case["layout"] == "row-padded":  # rows of a wider buffer (e.g. a slice of a fused output)
            x = activations((t, h + case["pad"]), gen, device, case.dtype)[:, :h]
        else:
            x = activations((t, h), gen, device, case.dtype)
        residual = None
        if case["variant"] == "fused-add":
            residual = activations((t, h), gen, device, case.dtype, scale=case.params.get("residual_scale", 1.0))
        return {"x": x, "residual": residual}

    def output_names(self, case):
        return ("out", "residual") if case["variant"] == "fused-add" else ("out",)

    def fuzz_strategy(self, dtype, profile):
        widths = sorted({load_config(m)["hidden_size"] for m in TEXT_MODELS + VISION_MODELS} | set(OTHER_REAL_WIDTHS))
        eps_values = sorted({load_config(m)["layer_norm_eps"] for m in TEXT_MODELS + VISION_MODELS})

        @st.composite
        def draw_case(draw):
            hidden = draw(real_or_near(widths))
            layout = draw(st.sampled_from(["contiguous", "row-padded"]))
            tokens = fuzz_cap(draw(token_counts(1024)), hidden, profile)
            variant = draw(st.sampled_from(list(VARIANTS)))
            params = dict(tokens=tokens, hidden=hidden, eps=draw(st.sampled_from(eps_values)), variant=variant,
                          layout=layout, residual_scale=draw(st.sampled_from([1.0, 4.0])))
            if layout == "row-padded":
                params["pad"] = draw(st.sampled_from([8, 64, hidden]))
            desc = "-".join(f"{k}{v}" for k, v in params.items() if k not in ("eps", "residual_scale"))
            return Case(f"fuzz-{desc}-{DTYPE_NAMES[dtype]}", dtype, params=params)

        return draw_case()

    def io_bytes(self, case):
        n = case["tokens"] * case["hidden"]
        tensors = 4 if case["variant"] == "fused-add" else 2  # x (+ residual) in, out (+ new residual) out
        return (tensors * n + 2 * case["hidden"]) * torch.finfo(case.dtype).bits // 8

    def flops(self, case):
        # mean, centre, square-and-sum, scale by rstd, weight, bias (+ the residual add)
        per_element = 7 if case["variant"] == "fused-add" else 6
        return per_element * case["tokens"] * case["hidden"]


TASK = LayerNormTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
