"""MambaChunkScanCombined (vLLM / mamba-ssm ``mamba_chunk_scan_combined``): Mamba-2's SSD scan over a
packed prefill batch, y [T, H, P] and every sequence's final state [S, H, P, N] (float32).

Cases are mamba2-2.7b's layer (80 heads of 64 on the full profile, 4 on the CPU; state 128, one
group, chunk 256) over the batches of :func:`tasks.linear_inputs.prefill_batches` (lengths on both
sides of the chunk boundary), each with no initial state and with states carried in (all but a new
first request of a batch continue, as chunked prefill and prefix reuse make them). On the full
profile the batches are the captured prefill calls (:func:`tasks.linear_inputs.captured_state_calls`)
with their shares, beside the chunk-edge batch and the 32k-token sequence. The truth is the
token-by-token recurrence in float64, so a chunked kernel is checked where chunking can go wrong:
at chunk boundaries, between sequences of one batch and from an initial state. The CPU profile
keeps the real chunk of 256 (2 x 256 + 3 tokens interpret in about a second). Inputs and their
ranges: :mod:`tasks.mamba_ssd`; z is not passed, as vLLM's mixer gates in its norm afterwards.
"""
import dataclasses

import torch
from hypothesis import strategies as st

from fk_pytest import Case, Task, standard_tests
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L1.mamba_chunk_scan import MambaChunkScanCombined

from ..linear_inputs import MAMBA2_MODELS, Mamba2Dims, captured_state_calls, kept_prefill_batches, mamba2_dims
from ..mamba_ssd import STATE_DTYPE, prefill_inputs
from ..workload import model_dtype


def _dims(case) -> Mamba2Dims:
    return Mamba2Dims(**case["dims"])


class MambaChunkScanTask(Task):
    name = "mamba_chunk_scan"
    level = 1
    family = "linear_attention"
    module_path = "L1/mamba_chunk_scan.py"
    reference = MambaChunkScanCombined
    fuzz_dtypes = ("bf16",)  # the served dtype; the kernel's float32 path is the same code

    def cases(self, profile):
        out = []
        for model in MAMBA2_MODELS:
            dims, dt = mamba2_dims(model, profile), model_dtype(model)
            captured = captured_state_calls(model, profile, ("prefill",))
            for ident, _, lengths, carried, weight in captured or ():
                out.append(Case(f"{model}-{ident}-{DTYPE_NAMES[dt]}", dt, model=model, weight=weight,
                                params=dict(lengths=list(lengths), with_state=any(carried),
                                            dims=dataclasses.asdict(dims), source="captured")))
            for batch, lengths, weight in kept_prefill_batches(dims.chunk_size, profile, captured):
                for init in ("zero", "state"):
                    out.append(Case(f"{model}-prefill-{batch}-{init}-{DTYPE_NAMES[dt]}", dt, model=model,
                                    weight=weight, params=dict(lengths=list(lengths), with_state=init == "state",
                                                dims=dataclasses.asdict(dims))))
        return out

    def init_args(self, case):
        return dict(chunk_size=_dims(case).chunk_size, dt_softplus=True, dt_limit=(0.0, float("inf")))

    def make_inputs(self, case, gen, device):
        return prefill_inputs(_dims(case), case["lengths"], case["with_state"], gen, device, case.dtype)

    def output_names(self, case):
        return ("out", "varlen_states")

    def fuzz_strategy(self, dtype, profile):
        real = mamba2_dims(MAMBA2_MODELS[0], profile)

        @st.composite
        def draw_case(draw):
            chunk = draw(st.sampled_from([real.chunk_size, 64, 128]))
            near = [1, chunk - 1, chunk, chunk + 1, 2 * chunk + 1]
            budget = 3 * chunk if profile == "cpu" else 16 * chunk
            lengths = draw(st.lists(st.one_of(st.sampled_from(near), st.integers(1, 2 * chunk + 7)),
                                    min_size=1, max_size=4))
            while len(lengths) > 1 and sum(lengths) > budget:
                lengths.pop()
            groups = draw(st.sampled_from([1, 2] if profile == "cpu" else [1, 8]))
            state = draw(st.sampled_from([real.state_size, 64]))
            with_state = draw(st.booleans())
            dims = dataclasses.replace(real, n_groups=groups, state_size=state, chunk_size=chunk)
            return Case(f"fuzz-L{'_'.join(map(str, lengths))}-c{chunk}-g{groups}-n{state}-"
                        f"{'state' if with_state else 'zero'}-{DTYPE_NAMES[dtype]}", dtype,
                        params=dict(lengths=lengths, with_state=with_state, dims=dataclasses.asdict(dims)))

        return draw_case()

    def io_bytes(self, case):
        d, t, s = _dims(case), sum(case["lengths"]), len(case["lengths"])
        act = torch.finfo(case.dtype).bits // 8
        state = d.num_heads * d.head_dim * d.state_size * torch.finfo(STATE_DTYPE).bits // 8
        tokens = t * (2 * d.num_heads * d.head_dim + d.num_heads + 2 * d.n_groups * d.state_size) * act
        return tokens + s * state * (2 if case["with_state"] else 1)

    def flops(self, case):
        d, t = _dims(case), sum(case["lengths"])
        # the causal half of each chunk's C B^T and weights @ x, plus the chunk states in and out
        return d.num_heads * t * (d.chunk_size * (d.state_size + d.head_dim) + 4 * d.head_dim * d.state_size)


TASK = MambaChunkScanTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
