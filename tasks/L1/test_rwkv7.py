"""ChunkRWKV7 (flash-linear-attention's ``chunk_rwkv7`` / ``fused_recurrent_rwkv7``): the time-mix
core of RWKV-7 World 2.9B, scored on both outputs, o and the float32 final states, against the
float64 token recurrence.

Cases per model: prefill batches whose lengths straddle the 64-token chunk FLA's layer uses
(``linear_inputs``; the reference kernel is recurrent, but a chunked candidate is then tested at
its boundaries), each from fresh states (None) and from carried ones, and decode batches (one token
per sequence, a state each). Inputs as FLA's layer produces them (``rwkv7_inputs``). The CPU
profile keeps the real 64 x 64 heads, 2 of them. Fuzz: 1-3 sequences (decode: up to 8) with
lengths around chunk and 16-token sub-chunk multiples (FLA's DPLR kernels default to 16-token
chunks), 1 or all heads, RWKV-7's 64-wide heads or 32-wide ones, with and without states.
"""
import torch
from hypothesis import strategies as st

from fk_pytest import Case, Task, standard_tests
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L1.rwkv7 import ChunkRWKV7

from ..linear_inputs import draw_scan_lengths, edge_lengths, scan_cases
from ..rwkv7_inputs import RWKV7_CHUNK, RWKV7_MODELS, rwkv7_dims, rwkv7_inputs
from ..workload import model_dtype

EDGE_LENGTHS = edge_lengths(RWKV7_CHUNK, (15, 17))


class RWKV7Task(Task):
    name = "rwkv7"
    level = 1
    family = "linear_attention"
    module_path = "L1/rwkv7.py"
    reference = ChunkRWKV7

    def cases(self, profile):
        out = []
        for model in RWKV7_MODELS:
            dims = rwkv7_dims(model, profile)
            out += scan_cases(model, model_dtype(model), RWKV7_CHUNK, profile,
                              dict(heads=dims.num_heads, head_k_dim=dims.head_dim, head_v_dim=dims.head_v_dim,
                                   decay_rank=dims.decay_low_rank_dim, a_rank=dims.a_low_rank_dim))
        return out

    def init_args(self, case):
        return {}

    def make_inputs(self, case, gen, device):
        return rwkv7_inputs(case["lengths"], case["heads"], case["head_k_dim"], case["head_v_dim"],
                            case["with_state"], gen, device, case.dtype, case["decay_rank"], case["a_rank"])

    def output_names(self, case):
        return ("o", "final_state")

    def fuzz_strategy(self, dtype, profile):
        real = [rwkv7_dims(m, profile) for m in RWKV7_MODELS]
        longest = 200 if profile == "cpu" else 5000

        @st.composite
        def draw_case(draw):
            dims = draw(st.sampled_from(real))
            heads = draw(st.sampled_from(sorted({1, dims.num_heads})))
            kd, vd = draw(st.sampled_from([(dims.head_dim, dims.head_v_dim),
                                           (dims.head_dim // 2, dims.head_v_dim // 2)]))
            lengths, with_state, _, ident = draw_scan_lengths(draw, EDGE_LENGTHS, longest)
            return Case(f"fuzz-{ident}-h{heads}-k{kd}-v{vd}-{DTYPE_NAMES[dtype]}", dtype,
                        params=dict(lengths=lengths, heads=heads, head_k_dim=kd, head_v_dim=vd, with_state=with_state,
                                    decay_rank=dims.decay_low_rank_dim, a_rank=dims.a_low_rank_dim))

        return draw_case()

    def io_bytes(self, case):
        t, n = sum(case["lengths"]), len(case["lengths"])
        h, kd, vd = case["heads"], case["head_k_dim"], case["head_v_dim"]
        half = torch.finfo(case.dtype).bits // 8
        tokens = t * h * (5 * kd + 2 * vd) * half  # r, w, k, a, b; v, o
        states = n * h * kd * vd * 4 * (2 if case["with_state"] else 1)  # read (when carried), written
        return tokens + states

    def flops(self, case):
        # per token and head over the K x V state: a^T S (2), decay, correction and rank-1 write (5),
        # read-out (2)
        return 9 * sum(case["lengths"]) * case["heads"] * case["head_k_dim"] * case["head_v_dim"]


TASK = RWKV7Task()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
