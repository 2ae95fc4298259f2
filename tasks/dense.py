"""Shared shape of the dense tasks (linear layers, embedding, LM head, MLP): one activation in,
one out, weights from a real config, token counts from the captured serving workloads (full
profile; see ``workload.token_cases``) or a few small hand-picked ones (CPU profile).

On the CPU profile the dense tasks use the small real models (Qwen2.5-0.5B, Qwen3-0.6B) so a
float64 truth of their weights stays small; the GPU profile uses the served 7-8B models.
"""
from typing import Dict, List, Tuple

import torch
from hypothesis import strategies as st

from fk_pytest import Case, Task
from fk_pytest.fuzz import token_counts
from fk_pytest.task import DTYPE_NAMES, at_degree

from .configs import load_config
from .workload import LLAMA_FAMILY, TOKENS, activations, fuzz_cap, model_dtype, token_cases

SMALL_MODELS = ("qwen2.5-0.5b", "qwen3-0.6b")
DENSE_TOKENS = {"cpu": {"decode": (1, 7), "prefill": (33,)}, "full": TOKENS["full"]}


def dense_models(profile: str) -> Tuple[str, ...]:
    return SMALL_MODELS if profile == "cpu" else LLAMA_FAMILY


class DenseTask(Task):
    """Subclasses give ``shape(cfg) -> (init_args, in_features, out_features)`` (or override)."""

    family = "linear"
    models = None  # override to pin the models (else the profile's dense models)
    input_name = "x"  # the forward parameter the activation is passed as

    def shape(self, cfg) -> Tuple[Dict, int, int]:
        raise NotImplementedError

    def model_list(self, profile):
        return self.models or dense_models(profile)

    def cases(self, profile):
        out = []
        for model in self.model_list(profile):
            cfg, dt = load_config(model), model_dtype(model)
            init, fan_in, fan_out = self.shape(cfg)
            for phase, t, weight, source in self.token_entries(model, profile, fan_in):
                out.append(Case(f"{model}-{phase}-T{t}-{DTYPE_NAMES[dt]}", dt, model=model, weight=weight,
                                params=dict(init=init, tokens=t, fan_in=fan_in, fan_out=fan_out, pad=0,
                                            source=source)))
        return self.with_tp_cases(out, profile)

    # ---- workload ---------------------------------------------------------------------------------
    captured_class = None  # the class whose captured calls are this task's (default: the reference)

    def captured_select(self, fan_in: int):
        """Which captured calls of the class are this task's: those whose activation is fan_in wide
        (RowParallelLinear serves both o_proj and down_proj)."""
        def select(group):
            first = next(v for v in group["args"].values() if isinstance(v, dict) and "shape" in v)
            return first["shape"][-1] == fan_in

        return select

    def token_entries(self, model, profile, fan_in) -> List[Tuple[str, int, float, str]]:
        """(phase, tokens, weight, source): captured on the full profile, else hand-picked."""
        if profile == "cpu":
            return [(phase, t, 1.0, "hand-picked") for phase, counts in DENSE_TOKENS["cpu"].items() for t in counts]
        cls = self.captured_class or self.reference.__name__
        entries = token_cases(model, profile, cls, {"": self.captured_select(fan_in)})[""]
        # every model's captured share sums to 1 (the select may keep part of the class's calls)
        total = sum(w for *_, w, source in entries if source == "captured")
        return [(phase, t, w / total if source == "captured" else w, source) for phase, t, w, source in entries]

    def init_args(self, case):
        return dict(case["init"])

    # ---- tensor parallelism (fk_pytest.tp_eval) ------------------------------------------------
    tp_degrees: Tuple[int, ...] = ()  # degrees the CPU profile also scores one prefill case at

    def with_tp_cases(self, cases: List[Case], profile: str) -> List[Case]:
        """``cases`` and, on the CPU profile, the first prefill case that every degree of
        ``tp_degrees`` divides again at each degree (``tp`` param). A GPU needs one device per
        rank: the full profile gets them once a multi-GPU machine runs it."""
        if profile != "cpu" or not self.tp_degrees:
            return cases
        from kernels_reference.parallel_state import tensor_parallel
        for base in (c for c in cases if "prefill" in c.id):
            try:
                for tp in self.tp_degrees:
                    with tensor_parallel(tp, 0), torch.device("meta"):
                        self.reference(**self.init_args(base))
            except ValueError:  # a width or head count the degree does not divide
                continue
            return cases + [at_degree(base, tp) for tp in self.tp_degrees]
        return cases

    def init_weights(self, module, gen):
        # Trained-network scale: each output about unit size for unit inputs.
        with torch.no_grad():
            for name, p in module.named_parameters():
                if p.dim() >= 2:  # a matrix, or stacked experts [E, out, in]: fan_in is the last dim
                    p.copy_(torch.randn(p.shape, generator=gen, device=p.device) * p.shape[-1] ** -0.5)
                elif name.endswith("bias"):
                    p.copy_(0.1 * torch.randn(p.shape, generator=gen, device=p.device))
                else:  # norm weights
                    p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen, device=p.device))

    def make_inputs(self, case, gen, device):
        t, fan_in, pad = case["tokens"], case["fan_in"], case["pad"]
        x = activations((t, fan_in + pad), gen, device, case.dtype)
        return {self.input_name: x[:, :fan_in] if pad else x}

    def fuzz_strategy(self, dtype, profile):
        @st.composite
        def draw_case(draw):
            model = draw(st.sampled_from(self.model_list(profile)))
            init, fan_in, fan_out = self.shape(load_config(model))
            t = fuzz_cap(draw(token_counts(300)), fan_out + fan_in, profile)
            pad = draw(st.sampled_from([0, 0, 8, fan_in]))
            return Case(f"fuzz-{model}-T{t}-pad{pad}-{DTYPE_NAMES[dtype]}", dtype, model=model,
                        params=dict(init=init, tokens=t, fan_in=fan_in, fan_out=fan_out, pad=pad))

        return draw_case()

    def io_bytes(self, case):
        t, i, o = case["tokens"], case["fan_in"], case["fan_out"]
        return (t * i + i * o + t * o) * torch.finfo(case.dtype).bits // 8

    def flops(self, case):
        return 2 * case["tokens"] * case["fan_in"] * case["fan_out"]
