"""What the all-reduce tasks share: their cases (decode and prefill token counts of a tensor-
parallel serving step, at degrees 2 and 4 on the CPU) and how one activation is split into the
ranks' partial sums.

A case's input ``x`` is the reduced result (on the CPU at degrees 2 and 4 over gloo); rank r of ``tp`` is called with a partial whose sum over
the ranks is ``x`` (``x / tp`` plus a per-rank offset, the offsets summing to zero over the ranks,
as a row-parallel layer's partial products do), drawn the same on every rank. The truth is then
``x`` itself (an all-reduce at degree 1 is the identity), in float64.
"""
import zlib
from typing import List

import torch
from hypothesis import strategies as st

from fk_pytest import Case, Task
from fk_pytest.fuzz import real_or_near, token_counts
from fk_pytest.task import DTYPE_NAMES

from .configs import load_config
from .workload import activations, fuzz_cap

# (tokens, degree) at the hidden width the reduction moves (the row-parallel o_proj / down_proj
# output): on the CPU a decode step of one sequence at degree 2, a prefill chunk at degree 4 and a
# decode step of 7 at degree 1 (the timed case); on GPUs the decode sizes serving reduces at.
CPU_CASES = ((1, 2), (33, 4), (7, 1))
FULL_TOKENS = (1, 8, 32, 64, 512)
MODELS = {"cpu": ("qwen2.5-0.5b",), "full": ("llama-3.1-8b", "mixtral-8x7b")}
PARTIAL_SPREAD = 0.5  # the ranks' offsets around x / tp, relative to x's scale
OTHER_REAL_WIDTHS = (2048, 3584, 5120, 7168, 8192)


class AllReduceTask(Task):
    level = 1
    family = "communication"
    module_path = "L1/all_reduce.py"
    fuzz_dtypes = ("bf16", "fp32")

    def cases(self, profile) -> List[Case]:
        out = []
        for model in MODELS[profile]:
            hidden = load_config(model)["hidden_size"]
            pairs = CPU_CASES if profile == "cpu" else [(t, tp) for t in FULL_TOKENS
                                                        for tp in (1,) + self.gpu_degrees()]
            out += [Case(f"{model}-T{t}-tp{tp}-bf16", torch.bfloat16, model=model,
                         params=dict(tokens=t, hidden=hidden, tp=tp)) for t, tp in pairs]
        return out

    @staticmethod
    def gpu_degrees():
        """Degrees this machine's GPUs can run (one per rank): none on a single GPU."""
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return tuple(tp for tp in (2, 4, 8) if tp <= count)

    def make_inputs(self, case, gen, device):
        return {"x": activations((case["tokens"], case["hidden"]), gen, device, case.dtype)}

    def rank_inputs(self, inputs, case, rank, tp):
        x = inputs["x"]
        gen = torch.Generator().manual_seed(zlib.crc32(f"{case.id}-partials".encode()))  # alike on every rank
        offsets = torch.randn((tp, *x.shape), generator=gen, dtype=torch.float64) * PARTIAL_SPREAD
        offsets -= offsets.mean(dim=0)
        scale = x.double().abs().mean()
        partial = x.double() / tp + offsets[rank].to(x.device) * scale
        return dict(inputs, x=partial.to(x.dtype))

    def fuzz_strategy(self, dtype, profile):
        @st.composite
        def draw_case(draw):
            hidden = draw(st.one_of(real_or_near(OTHER_REAL_WIDTHS), st.integers(8, 300)))
            params = dict(tokens=fuzz_cap(draw(token_counts(256)), hidden, profile), hidden=hidden, tp=1)
            return Case(f"fuzz-T{params['tokens']}-H{hidden}-{DTYPE_NAMES[dtype]}", dtype, params=params)

        return draw_case()

    def io_bytes(self, case):
        return 2 * case["tokens"] * case["hidden"] * torch.finfo(case.dtype).bits // 8
