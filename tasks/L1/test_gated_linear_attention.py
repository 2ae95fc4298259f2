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
from ..linear_inputs import decode_batches, prefill_batches
from ..workload import model_dtype

EDGE_LENGTHS = tuple(m * GLA_CHUNK + d for m in (1, 2) for d in (-1, 0, 1)) + (1, 2, 15, 17)


class GatedLinearAttentionTask(Task):
    name = "gated_linear_attention"
    level = 1
    family = "linear_attention"
    module_path = "L1/gla.py"
    reference = ChunkGLA

    def cases(self, profile):
        out = []
        for model in GLA_MODELS:
            dims, dt = gla_dims(model, profile), model_dtype(model)
            shape = dict(heads=dims.num_heads, head_k_dim=dims.head_k_dim, head_v_dim=dims.head_v_dim,
                         low_rank=dims.gate_low_rank_dim, normalizer=dims.gate_logit_normalizer)
            for name, lengths in prefill_batches(GLA_CHUNK, profile):
                for state in ("fresh", "carried"):
                    out.append(Case(f"{model}-prefill-{name}-{state}-{DTYPE_NAMES[dt]}", dt, model=model,
                                    params=dict(shape, lengths=tuple(lengths), with_state=state == "carried")))
            for name, n in decode_batches(profile):
                out.append(Case(f"{model}-decode-{name}-{DTYPE_NAMES[dt]}", dt, model=model,
                                params=dict(shape, lengths=(1,) * n, with_state=True)))
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
            if draw(st.booleans()):  # a decode step
                lengths, with_state, phase = (1,) * draw(st.integers(1, 8)), True, "decode"
            else:
                length = st.one_of(st.sampled_from(EDGE_LENGTHS), st.integers(1, longest))
                lengths = tuple(draw(st.lists(length, min_size=1, max_size=3)))
                with_state, phase = draw(st.booleans()), "prefill"
            lengths_id = "_".join(map(str, lengths)) if len(lengths) <= 4 else f"{len(lengths)}x1"
            return Case(f"fuzz-{phase}-L{lengths_id}-h{heads}-k{kd}-v{vd}-{'carried' if with_state else 'fresh'}-"
                        f"{DTYPE_NAMES[dtype]}", dtype,
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
