"""RMSNormGated (vLLM ``RMSNormGated`` / mamba-ssm ``RMSNormGated`` / FLA ``FusedRMSNormGated``): the
gated RMSNorm after the scan of Qwen3-Next's gated DeltaNet and of Mamba-2's mixer.

Qwen3-Next calls it as vLLM does, on the attention output flattened to one 128-wide head per row
([tokens * value heads, head_v_dim], one group per row, ``norm(x) * silu(z)``). Mamba-2 calls it
as mamba-ssm does, on [tokens, intermediate_size] with groups of intermediate_size / n_groups and
``norm(x * silu(z))``; its gate z is the first column block of the in_proj output (a strided
view), as the mixer passes it. Token counts on the full profile are the models' captured calls
with their shares (``tasks/workloads``), elsewhere the linear-attention family's decode batches and
prefill batches (their total tokens). Both real models have one group per row (mamba2-2.7b has
n_groups = 1), so the fuzz draws rows of 2-8 groups of real and nearby group sizes, where a kernel
normalising the whole row is wrong.
"""
import torch
from hypothesis import strategies as st

from fk_pytest import Case, Task, standard_tests
from fk_pytest.fuzz import real_or_near, token_counts
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L1.rms_norm_gated import RMSNormGated

from ..linear_inputs import (GATED_DELTA_CHUNK, GATED_DELTA_MODELS, MAMBA2_MODELS, decode_batches, gated_delta_dims,
                             mamba2_dims, prefill_batches)
from ..workload import activations, fuzz_cap, model_dtype, token_cases
from ..workloads import load_capture


def norm_layer(model: str, profile: str):
    """(norm params, rows per token, columns of the projection around a strided gate)."""
    if model in MAMBA2_MODELS:
        d = mamba2_dims(model, profile)
        # in_proj's output is [z (intermediate) | x, B, C | dt]: z is its first column block
        return (dict(hidden=d.intermediate_size, group_size=d.intermediate_size // d.n_groups,
                     norm_before_gate=False, eps=d.eps), 1, d.conv_dim + d.num_heads)
    d = gated_delta_dims(model, profile)
    return dict(hidden=d.head_v_dim, group_size=None, norm_before_gate=True, eps=d.eps), d.num_v_heads, 0


def token_batches(model: str, profile: str):
    """(phase name, tokens) of a model's cases: its decode batches, and its prefill batches' totals."""
    chunk = mamba2_dims(model, profile).chunk_size if model in MAMBA2_MODELS else GATED_DELTA_CHUNK
    prefill = prefill_batches(chunk, profile)
    if profile == "cpu":
        prefill = prefill[:1]  # the varlen batch adds nothing a row-wise norm would see
    return ([("decode", b) for _, b in decode_batches(profile)]
            + [(f"prefill-{name}", sum(lengths)) for name, lengths in prefill])


class RMSNormGatedTask(Task):
    name = "rms_norm_gated"
    level = 1
    family = "norm"
    module_path = "L1/rms_norm_gated.py"
    reference = RMSNormGated
    fuzz_dtypes = ("bf16", "fp32")  # both models serve in bf16; fp32 checks the kernel's arithmetic

    def cases(self, profile):
        out = []
        for model in GATED_DELTA_MODELS + MAMBA2_MODELS:
            params, heads, gate_after = norm_layer(model, profile)
            dt = model_dtype(model)
            if profile != "cpu" and load_capture(model) is not None:
                # the captured calls' leading dimension is rows (tokens x heads); hand-picked ones count tokens
                for phase, n, weight, source in token_cases(model, profile, "RMSNormGated")[""]:
                    rows = n if source == "captured" else n * heads
                    out.append(Case(f"{model}-{phase}-T{rows // heads}-{DTYPE_NAMES[dt]}", dt, model=model,
                                    weight=weight, params=dict(params, rows=rows, gate_after=gate_after,
                                                               source=source)))
                continue
            for phase, tokens in token_batches(model, profile):
                out.append(Case(f"{model}-{phase}-T{tokens}-{DTYPE_NAMES[dt]}", dt, model=model,
                                params=dict(params, rows=tokens * heads, gate_after=gate_after)))
        return out

    def init_args(self, case):
        return dict(hidden_size=case["hidden"], eps=case["eps"], group_size=case["group_size"],
                    norm_before_gate=case["norm_before_gate"])

    def make_inputs(self, case, gen, device):
        rows, hidden = case["rows"], case["hidden"]
        x = activations((rows, hidden), gen, device, case.dtype)
        projected = activations((rows, hidden + case["gate_after"]), gen, device, case.dtype)
        return {"x": x, "z": projected[:, :hidden]}

    def fuzz_strategy(self, dtype, profile):
        group_sizes = [128, 64, 256, 5120 // 8]  # head_v_dim, other head sizes, mamba2-2.7b's width in 8 groups

        @st.composite
        def draw_case(draw):
            group = draw(real_or_near(group_sizes))
            groups = draw(st.integers(2, 8))
            hidden = group * groups
            before = draw(st.booleans())
            rows = draw(token_counts(fuzz_cap(4096, hidden, profile) if profile == "cpu" else 16384))
            gate_after = draw(st.sampled_from([0, 72]))  # a packed gate, or a column slice
            return Case(f"fuzz-G{groups}x{group}-{'norm-then-gate' if before else 'gate-then-norm'}-R{rows}"
                        f"{'-slice' if gate_after else ''}-{DTYPE_NAMES[dtype]}", dtype,
                        params=dict(hidden=hidden, group_size=group, norm_before_gate=before, eps=1e-6,
                                    rows=rows, gate_after=gate_after))

        return draw_case()

    def io_bytes(self, case):
        elt = torch.finfo(case.dtype).bits // 8
        return 3 * case["rows"] * case["hidden"] * elt + case["hidden"] * elt  # x, z, out; weight

    def flops(self, case):
        return 8 * case["rows"] * case["hidden"]  # gate (sigmoid, 2 mul), square-sum, scale, weight


TASK = RMSNormGatedTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
