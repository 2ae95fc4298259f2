"""RMSNorm (vLLM ``RMSNorm``): plain, fused residual add, and Qwen3's per-head q/k norm.

Production runs three shapes of it: the first layer's input norm (plain), every other norm with
the residual add fused in (in place on both tensors in vLLM), and Qwen3's q/k norm over
head_dim=128 on strided per-head views of the fused qkv projection.
"""
import torch
from hypothesis import strategies as st

from fk_pytest import Case, Task, standard_tests
from fk_pytest.fuzz import real_or_near, token_counts
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L1.rms_norm import RMSNorm

from ..configs import head_dim, load_config
from ..workload import (DTYPE_SWEEP, HAND_PICKED_WEIGHT, LLAMA_FAMILY, activations, fuzz_cap, model_dtype,
                        token_cases)

OTHER_REAL_WIDTHS = (2048, 2560, 3072, 5120, 8192, 64, 256)  # other models' hidden / head sizes


class RMSNormTask(Task):
    name = "rms_norm"
    level = 1
    family = "norm"
    module_path = "L1/rms_norm.py"
    reference = RMSNorm

    def cases(self, profile):
        out = []
        for model in LLAMA_FAMILY:
            cfg, dt = load_config(model), model_dtype(model)
            for variant, entries in token_cases(model, profile, "RMSNorm", self._variants(cfg)).items():
                for phase, t, weight, source in entries:
                    extra = dict(weight=weight, source=source)
                    if variant in ("q", "k"):
                        out.append(self._qk_case(model, phase, t, variant, dt, cfg, **extra))
                    else:
                        out.append(self._case(model, phase, t, variant, dt, cfg["hidden_size"], cfg, **extra))
        model, counts = DTYPE_SWEEP[profile]
        cfg = load_config(model)
        weight = 1.0 if profile == "cpu" else HAND_PICKED_WEIGHT
        for dt in (torch.float16, torch.float32):
            for t in counts:
                for variant in ("plain", "fused-add"):
                    out.append(self._case(model, "sweep", t, variant, dt, cfg["hidden_size"], cfg, weight))
        return out

    @staticmethod
    def _variants(cfg):
        """Selects of the captured RMSNorm calls: the first layer's plain norm, the fused-add norms
        (every other), and Qwen3's per-head q/k norms ([T, heads, head_dim] views)."""
        def x_shape(g):
            return g["args"]["x"]["shape"]

        variants = {"plain": lambda g: g["args"]["residual"] is None and len(x_shape(g)) == 2,
                    "fused-add": lambda g: g["args"]["residual"] is not None}
        if cfg.get("qk_norm"):
            nq, nk = cfg["num_attention_heads"], cfg["num_key_value_heads"]
            variants["q"] = lambda g: len(x_shape(g)) == 3 and x_shape(g)[1] == nq
            variants["k"] = lambda g: len(x_shape(g)) == 3 and x_shape(g)[1] == nk
        return variants

    def _case(self, model, phase, t, variant, dt, hidden, cfg, weight=1.0, source="hand-picked"):
        suffix = "" if variant == "plain" else f"-{variant}"
        return Case(f"{model}-{phase}-T{t}{suffix}-{DTYPE_NAMES[dt]}", dt, model=model, weight=weight,
                    params=dict(tokens=t, hidden=hidden, eps=cfg["rms_norm_eps"], variant=variant,
                                layout="contiguous", source=source))

    def _qk_case(self, model, phase, t, which, dt, cfg, weight=1.0, source="hand-picked"):
        hd, nq, nk = head_dim(cfg), cfg["num_attention_heads"], cfg["num_key_value_heads"]
        return Case(f"{model}-{phase}-T{t}-{which}-norm-{DTYPE_NAMES[dt]}", dt, model=model, weight=weight,
                    params=dict(tokens=t, hidden=hd, eps=cfg["rms_norm_eps"], variant="plain",
                                layout="head-view", heads=nq if which == "q" else nk,
                                row_width=(nq + 2 * nk) * hd, offset=0 if which == "q" else nq * hd,
                                source=source))

    def init_args(self, case):
        return {"hidden_size": case["hidden"], "eps": case["eps"]}

    def make_inputs(self, case, gen, device):
        t, h, layout = case["tokens"], case["hidden"], case["layout"]
        if layout == "head-view":  # [T, heads, head_dim] view into the fused qkv output
            buf = activations((t, case["row_width"]), gen, device, case.dtype)
            n = case["heads"]
            x = buf[:, case["offset"]: case["offset"] + n * h].view(t, n, h)
        elif layout == "row-padded":  # rows of a wider buffer
            x = activations((t, h + case["pad"]), gen, device, case.dtype)[:, :h]
        else:
            x = activations((t, h), gen, device, case.dtype)
        residual = None
        if case["variant"] == "fused-add":
            residual = activations(tuple(x.shape), gen, device, case.dtype, scale=4.0)
        return {"x": x, "residual": residual}

    def output_names(self, case):
        return ("out", "residual") if case["variant"] == "fused-add" else ("out",)

    def mutable_inputs(self, case):
        # vLLM's fused_add_rms_norm writes both in place; the plain norm must not touch x
        # (the decoder layer keeps it as the residual).
        return ("x", "residual") if case["variant"] == "fused-add" else ()

    def fuzz_strategy(self, dtype, profile):
        widths = sorted({load_config(m)["hidden_size"] for m in LLAMA_FAMILY} | {128} | set(OTHER_REAL_WIDTHS))

        @st.composite
        def draw_case(draw):
            hidden = draw(real_or_near(widths))
            layout = draw(st.sampled_from(["contiguous", "row-padded", "head-view"]))
            heads = draw(st.integers(1, 12)) if layout == "head-view" else 1
            tokens = fuzz_cap(draw(token_counts(1024)), hidden * heads, profile)
            variant = draw(st.sampled_from(["plain", "fused-add"]))
            eps = draw(st.sampled_from([1e-5, 1e-6]))
            params = dict(tokens=tokens, hidden=hidden, eps=eps, variant=variant, layout=layout)
            if layout == "row-padded":
                params["pad"] = draw(st.sampled_from([8, 64, hidden]))
            if layout == "head-view":
                extra = draw(st.integers(0, 4))
                params.update(heads=heads, row_width=(heads + extra) * hidden,
                              offset=draw(st.integers(0, extra)) * hidden)
            desc = "-".join(f"{k}{v}" for k, v in params.items() if k not in ("eps",))
            return Case(f"fuzz-{desc}-{DTYPE_NAMES[dtype]}", dtype, params=params)

        return draw_case()

    def io_bytes(self, case):
        rows = case["tokens"] * case.params.get("heads", 1)
        n = rows * case["hidden"]
        tensors = 4 if case["variant"] == "fused-add" else 2
        return (tensors * n + case["hidden"]) * torch.finfo(case.dtype).bits // 8

    def flops(self, case):
        return 4 * case["tokens"] * case.params.get("heads", 1) * case["hidden"]


TASK = RMSNormTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
