"""MambaMixer2 (L2, vLLM): Mamba-2's mixer, in_proj -> short conv -> SSD scan -> gated norm ->
out_proj, with each sequence's conv window and SSM state in slot pools.

A case is one serving step: a batch of sequences, each with ``context`` tokens already folded into
its state and ``query`` new tokens, decode sequences first (vLLM's order). Prefill batches mix fresh
prompts and continued ones (a later chunk of a chunked prefill) at lengths on both sides of the
256-token chunk; decode batches continue every sequence; mixed steps hold both. The pools
(``conv_states`` in the model dtype, ``ssm_states`` float32) are inputs and in-place outputs,
compared whole: a sequence's slot must hold its new states, and slots no sequence owns (there are
spare ones) must come back unchanged. Every slot starts with random contents, which are the state
of a continuing sequence and garbage that must not leak into a fresh one.

mamba2-2.7b's layer; the CPU profile keeps its hidden size, head_dim, state and chunk but 4 heads,
and short prefills (the interpreted scan pays per chunk and head).
"""
import dataclasses
from typing import List, Sequence, Tuple

import torch
from hypothesis import strategies as st

from fk_pytest import Case, standard_tests
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L2.mamba_mixer2 import MambaMixer2

from ..configs import load_config
from ..dense import DenseTask
from ..linear_inputs import (MAMBA2_MODELS, Mamba2Dims, captured_layer_step_seqs, decode_batches, mamba2_dims,
                             prefill_batches)
from ..mamba_ssd import INITIAL_STATE_SCALE, STATE_DTYPE, head_params
from ..state_steps import StateTask
from ..workload import model_dtype


def _dims(case) -> Mamba2Dims:
    return Mamba2Dims(**case["dims"])


def _prefill(lengths: Sequence[int]) -> List[Tuple[int, int]]:
    """(context, query) per prefill sequence: every second one continues an earlier chunk."""
    return [((700 + 37 * i) if i % 2 else 0, n) for i, n in enumerate(lengths)]


def _decode(batch: int) -> List[Tuple[int, int]]:
    return [(17 + (53 * i) % 400, 1) for i in range(batch)]


def batches(chunk: int, profile: str) -> List[Tuple[str, List[Tuple[int, int]]]]:
    """(name, [(context, query)] with the decodes first) of a profile's steps."""
    if profile == "cpu":
        # The varlen prefill straddles the chunk (a fresh chunk + 1, a continued chunk - 1 and a
        # lone token); the mixed step has two decodes before a fresh and a continued prefill.
        return [("prefill-varlen", [(0, chunk + 1), (300, chunk - 1), (0, 1)]),
                ("decode-B3", _decode(3)),
                ("mixed-D2-P2", _decode(2) + [(0, 33), (260, 40)])]
    out = [(f"prefill-{name}", _prefill(lengths)) for name, lengths in prefill_batches(chunk, profile)]
    out += [(f"decode-{name}", _decode(batch)) for name, batch in decode_batches(profile)]
    out.append(("mixed-D32-P2", _decode(32) + [(0, 512), (2048, 1500)]))
    return out


class MambaMixer2Task(StateTask):
    name = "mamba_mixer2"
    level = 2
    family = "linear_attention"
    module_path = "L2/mamba_mixer2.py"
    reference = MambaMixer2
    fuzz_dtypes = ("bf16",)  # the served dtype

    def cases(self, profile):
        out = []
        for model in MAMBA2_MODELS:
            dims, dt = mamba2_dims(model, profile), model_dtype(model)
            steps = captured_layer_step_seqs(model, profile, batches(dims.chunk_size, profile))
            for name, seqs, weight, source in steps:
                out.append(Case(f"{model}-{name}-{DTYPE_NAMES[dt]}", dt, model=model, weight=weight,
                                params=dict(self._params(model, dims, seqs), source=source)))
        return out

    @staticmethod
    def _params(model, dims, seqs):
        cfg = load_config(model)
        return dict(dims=dataclasses.asdict(dims), context=[c for c, _ in seqs], query=[q for _, q in seqs],
                    conv_bias=bool(cfg.get("use_conv_bias", True)), bias=bool(cfg.get("use_bias", False)))

    def init_args(self, case):
        d = _dims(case)
        return dict(hidden_size=d.hidden_size, ssm_state_size=d.state_size, conv_kernel_size=d.conv_kernel,
                    intermediate_size=d.intermediate_size, use_conv_bias=case["conv_bias"], use_bias=case["bias"],
                    n_groups=d.n_groups, num_heads=d.num_heads, head_dim=d.head_dim, rms_norm_eps=d.eps,
                    chunk_size=d.chunk_size)

    def init_weights(self, module, gen):
        # Projections and conv taps at trained scale (conv1d.weight [C, 1, K]: randn / sqrt(K)), the
        # norm weight near 1; A, D and dt_bias in the ranges mamba-ssm draws and training keeps.
        DenseTask.init_weights(self, module, gen)
        device = module.A.device
        dims = dataclasses.replace(mamba2_dims(MAMBA2_MODELS[0]), num_heads=module.A.numel())
        heads = head_params(dims, gen, device, torch.float32)
        with torch.no_grad():
            module.A.copy_(heads["A"])
            module.D.copy_(heads["D"])
            module.dt_bias.copy_(heads["dt_bias"])

    def state_shapes(self, case):
        d = _dims(case)
        # An SSM state at the scale a few hundred tokens build up.
        return (d.conv_kernel - 1, d.conv_dim), (d.num_heads, d.head_dim, d.state_size), INITIAL_STATE_SCALE

    def make_inputs(self, case, gen, device):
        return self.layer_step_inputs(case, gen, device, _dims(case).hidden_size)

    def fuzz_strategy(self, dtype, profile):
        real = mamba2_dims(MAMBA2_MODELS[0], profile)
        model = MAMBA2_MODELS[0]

        @st.composite
        def draw_case(draw):
            chunk = draw(st.sampled_from([real.chunk_size, 64]))
            decodes = draw(st.integers(0, 3 if profile == "cpu" else 64))
            near = [1, chunk - 1, chunk, chunk + 1]
            budget = chunk + 8 if profile == "cpu" else 8 * chunk
            queries = draw(st.lists(st.one_of(st.sampled_from(near), st.integers(1, 2 * chunk + 7)),
                                    min_size=0 if decodes else 1, max_size=3))
            while len(queries) > 1 and sum(queries) > budget:
                queries.pop()
            continues = draw(st.lists(st.booleans(), min_size=len(queries), max_size=len(queries)))
            seqs = _decode(decodes) + [(draw(st.integers(1, 600)) if c else 0, n) for c, n in zip(continues, queries)]
            groups = draw(st.sampled_from([1, 2] if profile == "cpu" else [1, 8]))
            dims = dataclasses.replace(real, n_groups=groups, chunk_size=chunk)
            flags = "".join("s" if c else "z" for c in continues)
            return Case(f"fuzz-D{decodes}-P{'_'.join(map(str, queries)) or 0}{'-' + flags if flags else ''}"
                        f"-c{chunk}-g{groups}-{DTYPE_NAMES[dtype]}", dtype, model=model,
                        params=self._params(model, dims, seqs))

        return draw_case()

    def io_bytes(self, case):
        d, t = _dims(case), sum(case["query"])
        act = torch.finfo(case.dtype).bits // 8
        proj = 2 * d.intermediate_size + 2 * d.n_groups * d.state_size + d.num_heads
        weights = d.hidden_size * (proj + d.intermediate_size) + d.conv_dim * d.conv_kernel
        state = d.num_heads * d.head_dim * d.state_size * torch.finfo(STATE_DTYPE).bits // 8
        conv = (d.conv_kernel - 1) * d.conv_dim * act
        seqs = len(case["query"])
        continued = sum(c > 0 for c in case["context"])
        return (weights + 2 * t * d.hidden_size) * act + (seqs + continued) * (state + conv)

    def flops(self, case):
        d, t = _dims(case), sum(case["query"])
        proj = 2 * d.intermediate_size + 2 * d.n_groups * d.state_size + d.num_heads
        gemms = 2 * t * d.hidden_size * (proj + d.intermediate_size)
        # the causal half of each chunk's C B^T and weights @ x, plus the chunk states in and out
        # (a decode token: 6 per state element, within the same bound)
        scan = d.num_heads * t * (min(d.chunk_size, max(case["query"])) * (d.state_size + d.head_dim)
                                  + 4 * d.head_dim * d.state_size)
        return gemms + scan + 2 * t * d.conv_dim * d.conv_kernel


TASK = MambaMixer2Task()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
