"""SiluAndMul (vLLM ``SiluAndMul``): the gated activation between gate_up and down projections.

Its input is the fused gate_up projection output, [T, 2 * intermediate_size].
"""
import torch
from hypothesis import strategies as st

from fk_pytest import Case, Task, standard_tests
from fk_pytest.fuzz import real_or_near, token_counts
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L1.silu_and_mul import SiluAndMul

from ..configs import load_config
from ..workload import (DTYPE_SWEEP, HAND_PICKED_WEIGHT, LLAMA_FAMILY, activations, fuzz_cap, model_dtype,
                        token_cases)

OTHER_REAL_INTERMEDIATE = (11008, 13824, 8192, 5632, 27648)  # Llama-2-7B, Qwen2.5-14B, ...


class SiluAndMulTask(Task):
    name = "silu_and_mul"
    level = 1
    family = "activation"
    module_path = "L1/silu_and_mul.py"
    reference = SiluAndMul

    def cases(self, profile):
        out = []
        for model in LLAMA_FAMILY:
            for phase, t, weight, source in token_cases(model, profile, "SiluAndMul")[""]:
                out.append(self._case(model, phase, t, model_dtype(model), profile, weight, source))
        model, counts = DTYPE_SWEEP[profile]
        weight = 1.0 if profile == "cpu" else HAND_PICKED_WEIGHT
        for dt in (torch.float16, torch.float32):
            for t in counts:
                out.append(self._case(model, "sweep", t, dt, profile, weight))
        return out

    def _case(self, model, phase, t, dt, profile, weight=1.0, source="hand-picked"):
        d = load_config(model)["intermediate_size"]
        if profile == "cpu":  # real width, fewer tokens: the interpreter is slow
            t = fuzz_cap(t, 2 * d, profile)
        return Case(f"{model}-{phase}-T{t}-{DTYPE_NAMES[dt]}", dt, model=model, weight=weight,
                    params=dict(tokens=t, d=d, pad=0, source=source))

    def init_args(self, case):
        return {}

    def make_inputs(self, case, gen, device):
        t, d, pad = case["tokens"], case["d"], case["pad"]
        # gate_up outputs: gates spread over silu's curved region, ups like activations
        x = activations((t, 2 * d + pad), gen, device, case.dtype, scale=2.0)
        return {"x": x[:, : 2 * d] if pad else x}

    def fuzz_strategy(self, dtype, profile):
        widths = sorted({load_config(m)["intermediate_size"] for m in LLAMA_FAMILY} | set(OTHER_REAL_INTERMEDIATE))

        @st.composite
        def draw_case(draw):
            d = draw(st.one_of(real_or_near(widths), st.integers(1, 300)))
            t = fuzz_cap(draw(token_counts(512)), 2 * d, profile)
            pad = draw(st.sampled_from([0, 0, 16, 2 * d]))
            return Case(f"fuzz-d{d}-T{t}-pad{pad}-{DTYPE_NAMES[dtype]}", dtype,
                        params=dict(tokens=t, d=d, pad=pad))

        return draw_case()

    def io_bytes(self, case):
        return 3 * case["tokens"] * case["d"] * torch.finfo(case.dtype).bits // 8

    def flops(self, case):
        return 5 * case["tokens"] * case["d"]


TASK = SiluAndMulTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
