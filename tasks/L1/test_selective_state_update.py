"""SelectiveStateUpdate (vLLM / mamba-ssm ``selective_state_update``): Mamba-2's decode step, one
token per sequence, each sequence's state advanced in place in its slot of the state pool.

Cases are mamba2-2.7b's layer (80 heads of 64 on the full profile, 4 on the CPU; state 128, one
group) at the batch sizes of :func:`tasks.linear_inputs.decode_batches` (on the full profile, of the
captured decode calls with their shares). The pool has 2B + 1 slots
and the batch's slots are a random subset, so a kernel that writes the wrong slot, or rows in batch
order, changes slots it must not. The pool after the call is an output (``inplace_outputs``) and is
compared like y: the untouched slots must come back exactly. Inputs are vLLM's call: per-head dt,
A, D and dt_bias broadcast over head_dim (stride 0), x, B and C strided views of the conv output
(:mod:`tasks.mamba_ssd`), softplus on, z not passed.
"""
import dataclasses

import torch
from hypothesis import strategies as st

from fk_pytest import Case, Task, standard_tests
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L1.selective_state_update import SelectiveStateUpdate

from ..linear_inputs import MAMBA2_MODELS, Mamba2Dims, captured_state_calls, decode_batches, mamba2_dims
from ..mamba_ssd import STATE_DTYPE, decode_inputs
from ..workload import model_dtype


def _dims(case) -> Mamba2Dims:
    return Mamba2Dims(**case["dims"])


class SelectiveStateUpdateTask(Task):
    name = "selective_state_update"
    level = 1
    family = "linear_attention"
    module_path = "L1/selective_state_update.py"
    reference = SelectiveStateUpdate
    fuzz_dtypes = ("bf16",)  # the served dtype; the kernel's float32 path is the same code

    def cases(self, profile):
        out = []
        for model in MAMBA2_MODELS:
            dims, dt = mamba2_dims(model, profile), model_dtype(model)
            captured = captured_state_calls(model, profile, ("decode",))
            batches = ([(ident, len(lengths), weight, "captured") for ident, _, lengths, _, weight in captured]
                       if captured else [(f"decode-{name}", batch, 1.0, "hand-picked")
                                         for name, batch in decode_batches(profile)])
            for ident, batch, weight, source in batches:
                out.append(Case(f"{model}-{ident}-{DTYPE_NAMES[dt]}", dt, model=model, weight=weight,
                                params=dict(batch=batch, pool=2 * batch + 1, dims=dataclasses.asdict(dims),
                                            source=source)))
        return out

    def init_args(self, case):
        return dict(dt_softplus=True)

    def make_inputs(self, case, gen, device):
        return decode_inputs(_dims(case), case["batch"], case["pool"], gen, device, case.dtype)

    def output_names(self, case):
        return ("out",)

    def inplace_outputs(self, case):
        return ("state",)

    def mutable_inputs(self, case):
        return ("state",)

    def fuzz_strategy(self, dtype, profile):
        real = mamba2_dims(MAMBA2_MODELS[0], profile)

        @st.composite
        def draw_case(draw):
            batch = draw(st.one_of(st.sampled_from([1, 2, 3, 5, 7]), st.integers(1, 8 if profile == "cpu" else 512)))
            pool = batch + draw(st.integers(0, 2 * batch))
            heads = draw(st.sampled_from([real.num_heads, 2 * real.num_heads]))
            groups = draw(st.sampled_from([1, 2] if profile == "cpu" else [1, 8]))
            state = draw(st.sampled_from([real.state_size, 64, 256]))
            dims = dataclasses.replace(real, num_heads=heads, n_groups=groups, state_size=state)
            return Case(f"fuzz-B{batch}-pool{pool}-h{heads}-g{groups}-n{state}-{DTYPE_NAMES[dtype]}", dtype,
                        params=dict(batch=batch, pool=pool, dims=dataclasses.asdict(dims)))

        return draw_case()

    def io_bytes(self, case):
        d, b = _dims(case), case["batch"]
        act = torch.finfo(case.dtype).bits // 8
        state = d.num_heads * d.head_dim * d.state_size * torch.finfo(STATE_DTYPE).bits // 8
        return b * (2 * state + (2 * d.num_heads * d.head_dim + d.num_heads + 2 * d.n_groups * d.state_size) * act)

    def flops(self, case):
        d = _dims(case)
        return 6 * case["batch"] * d.num_heads * d.head_dim * d.state_size  # decay, update, read-out


TASK = SelectiveStateUpdateTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
