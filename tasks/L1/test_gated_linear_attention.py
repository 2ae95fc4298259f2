"""ChunkGLA (flash-linear-attention's ``chunk_gla`` / ``fused_recurrent_gla``): the gated linear
attention core of GLA-1.3B, scored on both outputs, o and the float32 final states, against the
float64 token recurrence.

Cases per model: prefill batches whose lengths straddle the 64-token chunk (``linear_inputs``), each
from fresh states (None) and from carried ones, and decode batches (one token per sequence, a state
each). Inputs as FLA's layer produces them (``gla_inputs``). The CPU profile keeps the real
256 x 512 heads, 2 of them. Fuzz: 1-3 sequences (decode: up to 8) with lengths around chunk and
sub-chunk multiples, GLA-1.3B's heads or half-size ones (128 x 256), with and without states.
"""
import torch
from hypothesis import strategies as st

from fk_pytest import Case, Task, standard_tests
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L1.gla import ChunkGLA

from ..gla_inputs import GLA_CHUNK, GLA_MODELS, gla_dims, gla_inputs
from ..linear_inputs import draw_scan_lengths, edge_lengths, scan_cases
from ..workload import model_dtype

EDGE_LENGTHS = edge_lengths(GLA_CHUNK, (15, 17))  # and around the 16-token sub-chunk


class GatedLinearAttentionTask(Task):
    name = "gated_linear_attention"
    level = 1
    family = "linear_attention"
    module_path = "L1/gla.py"
    reference = ChunkGLA

    def cases(self, profile):
        out = []
        for model in GLA_MODELS:
            dims = gla_dims(model, profile)
            out += scan_cases(model, model_dtype(model), GLA_CHUNK, profile,
                              dict(heads=dims.num_heads, head_k_dim=dims.head_k_dim, head_v_dim=dims.head_v_dim,
                                   low_rank=dims.gate_low_rank_dim, normalizer=dims.gate_logit_normalizer))
        return out

    def init_args(self, case):
        return {}

    def make_inputs(self, case, gen, device):
        return gla_inputs(case["lengths"], case["heads"], case["head_k_dim"], case["head_v_dim"], case["with_state"],
                          gen, device, case.dtype, case["low_rank"], case["normalizer"])

    def output_names(self, case):
        return ("o", "final_state")

    def fuzz_strategy(self, dtype, profile):
        real = [gla_dims(m, profile) for m in GLA_MODELS]
        longest = 200 if profile == "cpu" else 5000

        @st.composite
        def draw_case(draw):
            dims = draw(st.sampled_from(real))
            heads = draw(st.sampled_from(sorted({1, dims.num_heads})))
            kd, vd = draw(st.sampled_from([(dims.head_k_dim, dims.head_v_dim),
                                           (dims.head_k_dim // 2, dims.head_v_dim // 2)]))
            lengths, with_state, _, ident = draw_scan_lengths(draw, EDGE_LENGTHS, longest)
            return Case(f"fuzz-{ident}-h{heads}-k{kd}-v{vd}-{DTYPE_NAMES[dtype]}", dtype,
                        params=dict(lengths=lengths, heads=heads, head_k_dim=kd, head_v_dim=vd, with_state=with_state,
                                    low_rank=dims.gate_low_rank_dim, normalizer=dims.gate_logit_normalizer))

        return draw_case()

    def io_bytes(self, case):
        t, n = sum(case["lengths"]), len(case["lengths"])
        h, kd, vd = case["heads"], case["head_k_dim"], case["head_v_dim"]
        half = torch.finfo(case.dtype).bits // 8
        tokens = t * h * (3 * kd + 2 * vd) * half  # q, k, g; v, o
        states = n * h * kd * vd * 4 * (2 if case["with_state"] else 1)  # read (when carried), written
        return tokens + states

    def flops(self, case):
        # per token and head over the K x V state: decay and rank-1 write (3), read-out (2)
        return 5 * sum(case["lengths"]) * case["heads"] * case["head_k_dim"] * case["head_v_dim"]


TASK = GatedLinearAttentionTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
