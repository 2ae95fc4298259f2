"""TopKSoftmax (vLLM ``topk_softmax``): the router's gating step of the MoE models, [T, E] logits to
the k largest softmax probabilities (descending, float32) and their expert ids (int32).

Logits are the skewed, tie-free router logits of :mod:`tasks.moe` (the k+1 largest are apart by a
clear margin, so ids are unique and must match exactly). Widths are the real expert counts on both
profiles (a row is at most 128 logits); the CPU profile only runs fewer tokens (see ``tasks.moe``).
"""
import torch
from hypothesis import strategies as st

from fk_pytest import Case, Task, standard_tests
from fk_pytest.fuzz import token_counts
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L1.topk_softmax import TopKSoftmax

from ..moe_inputs import MOE_MODELS, moe_shape, moe_token_cases, router_logits
from ..workload import model_dtype


class TopKSoftmaxTask(Task):
    name = "topk_softmax"
    level = 1
    family = "moe"
    module_path = "L1/topk_softmax.py"
    reference = TopKSoftmax

    def cases(self, profile):
        out = []
        for model in MOE_MODELS:
            shape, dt = moe_shape(model), model_dtype(model)
            for phase, t, weight, source in moe_token_cases(model, profile):
                out.append(Case(f"{model}-{phase}-T{t}-{DTYPE_NAMES[dt]}", dt, model=model, weight=weight,
                                params=dict(tokens=t, experts=shape.num_experts, top_k=shape.top_k,
                                            renormalize=shape.renormalize, source=source)))
        return out

    def init_args(self, case):
        return dict(top_k=case["top_k"], renormalize=case["renormalize"])

    def make_inputs(self, case, gen, device):
        return {"gating_output": router_logits(case["tokens"], case["experts"], case["top_k"], gen, device,
                                               case.dtype)}

    def output_names(self, case):
        return ("topk_weights", "topk_ids")

    def fuzz_strategy(self, dtype, profile):
        real = [moe_shape(m) for m in MOE_MODELS]

        @st.composite
        def draw_case(draw):
            experts = draw(st.one_of(st.sampled_from([s.num_experts for s in real]), st.integers(3, 160)))
            # k >= 2: with one expert a renormalised weight is the constant 1 (nothing to compare)
            top_k = draw(st.integers(2, min(8, experts - 1)))
            renormalize = draw(st.booleans())
            t = draw(token_counts(64 if profile == "cpu" else 4096))
            return Case(f"fuzz-E{experts}-k{top_k}-{'renorm' if renormalize else 'probs'}-T{t}-"
                        f"{DTYPE_NAMES[dtype]}", dtype,
                        params=dict(tokens=t, experts=experts, top_k=top_k, renormalize=renormalize))

        return draw_case()

    def io_bytes(self, case):
        t = case["tokens"]
        return t * case["experts"] * torch.finfo(case.dtype).bits // 8 + t * case["top_k"] * 8

    def flops(self, case):
        return 4 * case["tokens"] * case["experts"]  # max, exp, sum, divide per logit


TASK = TopKSoftmaxTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
