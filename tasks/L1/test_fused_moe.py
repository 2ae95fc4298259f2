"""FusedMoE (vLLM ``FusedMoE``): the routed experts of Mixtral-8x7B, Qwen3-30B-A3B and
DeepSeek-V2-Lite: route by the router logits (top-k softmax), per pair gate_up GEMM, SiluAndMul,
down GEMM scaled by the routing weight, summed over the k experts of each token.

Weights at a trained scale (N(0, 1/fan_in)); hidden states like a layer's normalised input; router
logits skewed per expert and tie-free with a margin (:mod:`tasks.moe`: real routing statistics need
trained router weights, which we do not have). The CPU profile keeps every model's real E, k and
renormalisation but cuts H and I to 64-128 and 32-64 (``tasks.moe.CPU_WIDTHS``) and runs 1-17
tokens, so the float64 truth and the interpreted Triton kernels stay fast; the full profile runs
the real widths at the token counts of the models' captured workloads (call-share weights).

Bytes: the weights of the experts one draw of the routing activates, read once, plus the
activations and logits in and the output out; FLOPs: 2 * T * k * 3 * H * I (gate, up and down).
"""
import torch
from hypothesis import strategies as st

from fk_pytest import Case, Task, standard_tests
from fk_pytest.fuzz import real_or_near, token_counts
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L1.fused_moe import FusedMoE

from ..moe_inputs import MOE_MODELS, activated_experts, moe_shape, moe_token_cases, router_logits
from ..workload import activations, model_dtype

FULL_MAX_FUZZ_TOKENS = 300


class FusedMoETask(Task):
    name = "fused_moe"
    level = 1
    family = "moe"
    module_path = "L1/fused_moe.py"
    reference = FusedMoE

    def cases(self, profile):
        out = []
        for model in MOE_MODELS:
            shape, dt = moe_shape(model, profile), model_dtype(model)
            for phase, t, weight, source in moe_token_cases(model, profile):
                out.append(Case(f"{model}-{phase}-T{t}-{DTYPE_NAMES[dt]}", dt, model=model, weight=weight,
                                params=dict(init=shape.init_args(), tokens=t, source=source)))
        return out

    def init_args(self, case):
        return dict(case["init"])

    def init_weights(self, module, gen):
        # Trained scale: each GEMM maps unit-size inputs to unit-size outputs (std 1/sqrt(fan_in)).
        with torch.no_grad():
            for p in (module.w13_weight, module.w2_weight):
                p.copy_(torch.randn(p.shape, generator=gen, device=p.device) * p.shape[-1] ** -0.5)

    def make_inputs(self, case, gen, device):
        init = case["init"]
        x = activations((case["tokens"], init["hidden_size"]), gen, device, case.dtype)
        logits = router_logits(case["tokens"], init["num_experts"], init["top_k"], gen, device, case.dtype)
        return {"hidden_states": x, "router_logits": logits}

    def fuzz_strategy(self, dtype, profile):
        cpu = profile == "cpu"
        hidden_widths = sorted({moe_shape(m, profile).hidden_size for m in MOE_MODELS})
        inter_widths = sorted({moe_shape(m, profile).intermediate_size for m in MOE_MODELS})

        @st.composite
        def draw_case(draw):
            model = draw(st.sampled_from(MOE_MODELS))
            real = moe_shape(model, profile)
            # the real routing (E, k, renormalisation), or a made-up one
            experts, top_k, renorm = draw(st.one_of(
                st.just((real.num_experts, real.top_k, real.renormalize)),
                st.integers(2, 64).flatmap(lambda e: st.tuples(st.just(e), st.integers(1, min(8, e - 1) or 1),
                                                                 st.booleans()))))
            if top_k == 1:
                renorm = False  # one renormalised weight is the constant 1: nothing to learn from it
            if cpu:
                hidden = draw(st.one_of(st.sampled_from(hidden_widths), st.integers(8, 160)))
                inter = draw(st.one_of(st.sampled_from(inter_widths), st.integers(8, 96)))
                t = draw(token_counts(33))
            else:
                hidden, inter = draw(real_or_near(hidden_widths)), draw(real_or_near(inter_widths))
                t = draw(token_counts(FULL_MAX_FUZZ_TOKENS))
            init = dict(num_experts=experts, top_k=top_k, hidden_size=hidden, intermediate_size=inter,
                        renormalize=renorm)
            return Case(f"fuzz-E{experts}-k{top_k}-H{hidden}-I{inter}-T{t}-{DTYPE_NAMES[dtype]}", dtype,
                        model=model, params=dict(init=init, tokens=t))

        return draw_case()

    def io_bytes(self, case):
        init, t = case["init"], case["tokens"]
        h, i, e, k = init["hidden_size"], init["intermediate_size"], init["num_experts"], init["top_k"]
        size = torch.finfo(case.dtype).bits // 8
        weights = activated_experts(t, e, k) * 3 * h * i
        return (weights + 2 * t * h + t * e) * size

    def flops(self, case):
        init = case["init"]
        return 6 * case["tokens"] * init["top_k"] * init["hidden_size"] * init["intermediate_size"]


TASK = FusedMoETask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
