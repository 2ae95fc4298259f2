"""ShortConvolution (FLA's name; vLLM's ``causal_conv1d_fn`` / ``causal_conv1d_update`` calls): the
causal depthwise convolution with SiLU over Qwen3-Next's (q, k, v) and Mamba-2's (x, B, C) channels.

Prefill cases are packed variable-length batches (lengths on both sides of a 64-token tile), each
either fresh (no sequence has a state: zeros before its first token) or continued (every sequence
starts from its slot's conv state, as a later chunk of a chunked prefill does); decode cases are
one token per sequence, continuing its state. The conv-state pool is an in-place output, compared
whole: each named slot must hold its sequence's last K - 1 inputs, every other slot must be
untouched. Mamba-2's input is the (x, B, C) column slice of its in_proj output, as the mixer
passes it (strided rows); Qwen3-Next's is contiguous. Sequences get distinct random pool slots.
On the full profile the calls are the models' captured ones with their shares (each sequence fresh
or continued as it was in its step), beside the chunk-edge batch and the 32k-token sequence.
"""
import torch
from hypothesis import strategies as st

from fk_pytest import Case, Task, standard_tests
from fk_pytest.fuzz import real_or_near, token_counts
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L1.short_convolution import ShortConvolution

from ..configs import load_config
from ..linear_inputs import (GATED_DELTA_CHUNK, GATED_DELTA_MODELS, MAMBA2_MODELS, captured_state_calls, cu_seqlens,
                             decode_batches, gated_delta_dims, kept_prefill_batches, mamba2_dims)
from ..workload import activations, fuzz_cap, model_dtype

SPARE_SLOTS = 3  # pool slots no sequence of the batch owns: they must come back unchanged


def conv_layer(model: str, profile: str):
    """(conv channels, kernel, has bias, extra projection columns around the conv slice)."""
    if model in MAMBA2_MODELS:
        d = mamba2_dims(model, profile)
        bias = bool(load_config(model).get("use_conv_bias", True))
        # in_proj's output is [z (intermediate) | x, B, C (conv_dim) | dt (heads)]
        return d.conv_dim, d.conv_kernel, bias, (d.intermediate_size, d.num_heads)
    d = gated_delta_dims(model, profile)
    return d.conv_dim, d.conv_kernel, False, (0, 0)


class ShortConvolutionTask(Task):
    name = "short_convolution"
    level = 1
    family = "linear_attention"
    module_path = "L1/short_convolution.py"
    reference = ShortConvolution
    may_mutate = ("conv_states",)
    fuzz_dtypes = ("bf16", "fp32")  # both models serve in bf16; fp32 checks the kernel's arithmetic

    def cases(self, profile):
        out = []
        for model in GATED_DELTA_MODELS + MAMBA2_MODELS:
            dim, kernel, bias, around = conv_layer(model, profile)
            dt = model_dtype(model)
            common = dict(dim=dim, kernel=kernel, bias=bias, around=around)
            captured = captured_state_calls(model, profile)
            for ident, phase, lengths, carried, weight in captured or ():
                out.append(Case(f"{model}-{ident}-{DTYPE_NAMES[dt]}", dt, model=model, weight=weight,
                                params=dict(common, phase=phase, lengths=lengths, initial=list(carried),
                                            source="captured")))
            for name, lengths, weight in kept_prefill_batches(GATED_DELTA_CHUNK, profile, captured):
                # On the CPU a lone sequence runs only continued (fresh is the varlen case's job).
                for start in (("cont",) if profile == "cpu" and name == "one" else ("fresh", "cont")):
                    out.append(Case(f"{model}-prefill-{name}-{start}-{DTYPE_NAMES[dt]}", dt, model=model,
                                    weight=weight, params=dict(common, phase="prefill", lengths=lengths,
                                                               initial=[start == "cont"] * len(lengths))))
            for name, batch in decode_batches(profile) if captured is None else ():
                out.append(Case(f"{model}-decode-{name}-{DTYPE_NAMES[dt]}", dt, model=model,
                                params=dict(common, phase="decode", lengths=(1,) * batch, initial=[True] * batch)))
        return out

    def init_args(self, case):
        return dict(hidden_size=case["dim"], kernel_size=case["kernel"], bias=case["bias"], activation="silu")

    def init_weights(self, module, gen):
        # Trained conv taps are small and of both signs (not the base class's 1 + noise).
        with torch.no_grad():
            module.weight.copy_(0.5 * torch.randn(module.weight.shape, generator=gen, device=module.weight.device))
            if module.bias is not None:
                module.bias.copy_(0.2 * torch.randn(module.bias.shape, generator=gen, device=module.bias.device))

    def make_inputs(self, case, gen, device):
        lengths, dim, kernel = case["lengths"], case["dim"], case["kernel"]
        before, after = case["around"]
        tokens, batch = sum(lengths), len(lengths)
        projected = activations((tokens, before + dim + after), gen, device, case.dtype)
        x = projected[:, before: before + dim]
        slots = batch + SPARE_SLOTS
        inputs = {"x": x,
                  # A state holds earlier inputs of the sequence: the same distribution as x.
                  "conv_states": activations((slots, kernel - 1, dim), gen, device, case.dtype),
                  "cache_indices": torch.randperm(slots, generator=gen, device=device)[:batch].to(torch.int32)}
        if case["phase"] == "prefill":
            inputs["query_start_loc"] = cu_seqlens(lengths, device)
            inputs["has_initial_state"] = torch.tensor(case["initial"], dtype=torch.bool, device=device)
        return inputs

    def inplace_outputs(self, case):
        return ("conv_states",)

    def fuzz_strategy(self, dtype, profile):
        layers = [conv_layer(m, profile) for m in GATED_DELTA_MODELS + MAMBA2_MODELS]

        @st.composite
        def draw_case(draw):
            dim = draw(real_or_near([layer[0] for layer in layers]))
            kernel = draw(st.sampled_from([4, 2, 3]))
            bias = draw(st.booleans())
            if draw(st.booleans()):
                budget = fuzz_cap(1024, dim, profile) if profile == "cpu" else 8192
                lengths = draw(st.lists(token_counts(budget), min_size=1, max_size=4))
                while sum(lengths) > budget and len(lengths) > 1:  # keep one CPU case interpretable
                    lengths.pop()
                lengths = [min(n, budget) for n in lengths]
                initial = draw(st.lists(st.booleans(), min_size=len(lengths), max_size=len(lengths)))
                phase, shape = "prefill", "x".join(map(str, lengths))
                flags = "".join("s" if i else "z" for i in initial)
            else:
                batch = draw(st.integers(1, 8 if profile == "cpu" else 256))
                lengths, initial, phase, shape, flags = (1,) * batch, [True] * batch, "decode", f"B{batch}", ""
            around = draw(st.sampled_from([(0, 0), (64, 8)]))  # contiguous rows, or a column slice
            return Case(f"fuzz-{phase}-D{dim}-K{kernel}-{'bias' if bias else 'nobias'}-{shape}"
                        f"{'-' + flags if flags else ''}{'-slice' if around[0] else ''}-{DTYPE_NAMES[dtype]}",
                        dtype, params=dict(dim=dim, kernel=kernel, bias=bias, around=around, phase=phase,
                                           lengths=tuple(lengths), initial=list(initial)))

        return draw_case()

    def io_bytes(self, case):
        elt = torch.finfo(case.dtype).bits // 8
        tokens, dim, kernel = sum(case["lengths"]), case["dim"], case["kernel"]
        continued = sum(case["initial"])
        states = (continued + len(case["lengths"])) * (kernel - 1) * dim * elt  # read if continued, written
        return 2 * tokens * dim * elt + dim * (kernel + case["bias"]) * elt + states

    def flops(self, case):
        return sum(case["lengths"]) * case["dim"] * (2 * case["kernel"] + 4)  # taps, bias, SiLU


TASK = ShortConvolutionTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
