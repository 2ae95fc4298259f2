"""GatedDeltaRule (flash-linear-attention's ``chunk_gated_delta_rule`` / ``fused_recurrent_gated_delta_rule``):
the linear-attention core of Qwen3-Next's gated DeltaNet layers, scored on both outputs, o and the
float32 final states.

Cases per model: prefill batches whose lengths straddle the 64-token chunk (``linear_inputs``), each
from fresh states (None) and from carried ones, and decode batches (one token per sequence, a state
each). Inputs as the layer produces them (``gated_delta_inputs``). The CPU profile keeps the real
head dims (128) with 2 key and 4 value heads. Fuzz: 1-3 sequences (decode: up to 8) with lengths
around chunk multiples, key heads shared by 1 or 2 value heads, with and without states.
"""
import torch
from hypothesis import strategies as st

from fk_pytest import Case, Task, standard_tests
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L1.gated_delta_rule import GatedDeltaRule

from ..gated_delta_inputs import gated_delta_inputs
from ..linear_inputs import (GATED_DELTA_CHUNK, GATED_DELTA_MODELS, draw_scan_lengths, edge_lengths, gated_delta_dims,
                             scan_cases)
from ..workload import model_dtype

EDGE_LENGTHS = edge_lengths(GATED_DELTA_CHUNK)


class GatedDeltaRuleTask(Task):
    name = "gated_delta_rule"
    level = 1
    family = "linear_attention"
    module_path = "L1/gated_delta_rule.py"
    reference = GatedDeltaRule

    def cases(self, profile):
        out = []
        for model in GATED_DELTA_MODELS:
            dims = gated_delta_dims(model, profile)
            out += scan_cases(model, model_dtype(model), GATED_DELTA_CHUNK, profile,
                              dict(k_heads=dims.num_k_heads, v_heads=dims.num_v_heads, head_k_dim=dims.head_k_dim,
                                   head_v_dim=dims.head_v_dim))
        return out

    def init_args(self, case):
        return {}

    def make_inputs(self, case, gen, device):
        return gated_delta_inputs(case["lengths"], case["k_heads"], case["v_heads"], case["head_k_dim"],
                                  case["head_v_dim"], case["with_state"], gen, device, case.dtype)

    def output_names(self, case):
        return ("o", "final_state")

    def fuzz_strategy(self, dtype, profile):
        real = [gated_delta_dims(m, profile) for m in GATED_DELTA_MODELS]
        longest = 200 if profile == "cpu" else 5000

        @st.composite
        def draw_case(draw):
            dims = draw(st.sampled_from(real))
            k_heads = draw(st.sampled_from(sorted({1, dims.num_k_heads})))
            group = draw(st.sampled_from([1, 2]))
            lengths, with_state, _, ident = draw_scan_lengths(draw, EDGE_LENGTHS, longest)
            return Case(f"fuzz-{ident}-hk{k_heads}-hv{k_heads * group}-{DTYPE_NAMES[dtype]}", dtype,
                        params=dict(lengths=lengths, k_heads=k_heads, v_heads=k_heads * group,
                                    head_k_dim=dims.head_k_dim, head_v_dim=dims.head_v_dim, with_state=with_state))

        return draw_case()

    def io_bytes(self, case):
        t, n = sum(case["lengths"]), len(case["lengths"])
        hk, hv, kd, vd = case["k_heads"], case["v_heads"], case["head_k_dim"], case["head_v_dim"]
        half = torch.finfo(case.dtype).bits // 8
        tokens = t * (2 * hk * kd * half + 2 * hv * vd * half + hv * (4 + half))  # q, k, v, o; g, beta
        states = n * hv * kd * vd * 4 * (2 if case["with_state"] else 1)  # read (when carried), written
        return tokens + states

    def flops(self, case):
        # per token and value head: decay, S^T k, the rank-1 update and S^T q over the K x V state
        return 7 * sum(case["lengths"]) * case["v_heads"] * case["head_k_dim"] * case["head_v_dim"]


TASK = GatedDeltaRuleTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
