"""What the Mamba-2 layer and model tasks (L3 ``mamba2_decoder_layer``, L4 ``mamba2_for_causal_lm``)
share: the model config cut to a case (heads, layers, vocabulary), trained-scale weights for every
mixer inside, the steps a case runs and their fuzzed variants.

A case is one engine step as in the mixer's task (``tasks/L2/test_mamba_mixer2.py``): sequences
with ``context`` tokens already in their states and ``query`` new ones, decodes first, each
layer's conv and SSM pools inputs and in-place outputs (``tasks/state_steps.py``). The full profile
runs the mixer task's steps; the CPU profile keeps the real hidden size, head_dim, state and
256-token chunk with 4 heads, and steps short enough that a layer stack stays cheap interpreted
(chunk crossings are the mixer's and the scan's tasks' business; here, one prefill of each kind,
a decode batch and a mixed step, and fuzzed steps at a 64-token chunk that do cross it).
"""
import dataclasses
from typing import List, Tuple

import torch
from hypothesis import strategies as st

from fk_pytest import Case
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L2.mamba_mixer2 import MambaMixer2
from kernels_reference.L3.mamba2_decoder_layer import Mamba2ArchConfig

from .configs import load_config
from .dense import DenseTask
from .L2.test_mamba_mixer2 import MambaMixer2Task, batches
from .linear_inputs import MAMBA2_MODELS, Mamba2Dims, captured_layer_step_seqs, mamba2_dims
from .mamba_ssd import INITIAL_STATE_SCALE, head_params
from .state_steps import StateTask
from .workload import model_dtype

# CPU steps: (name, [(context, query)] with the decodes first).
CPU_STEPS = [("prefill-B2", [(0, 40), (300, 23)]),
             ("decode-B3", [(17, 1), (70, 1), (123, 1)]),
             ("mixed-D2-P2", [(17, 1), (70, 1), (0, 33), (260, 19)])]


def dims_of(case) -> Mamba2Dims:
    return Mamba2Dims(**case["dims"])


def arch_config(case, layers: int = 1) -> Mamba2ArchConfig:
    """The model's config at the case's dims (the CPU profile's fewer heads), ``layers`` deep, with
    the case's vocabulary (the L4 task shards it on the CPU)."""
    d, cfg = dims_of(case), load_config(case.model)
    return Mamba2ArchConfig(
        vocab_size=case.params.get("vocab", cfg["vocab_size"]), hidden_size=d.hidden_size,
        num_hidden_layers=layers, num_heads=d.num_heads, head_dim=d.head_dim, state_size=d.state_size,
        n_groups=d.n_groups, conv_kernel=d.conv_kernel, chunk_size=d.chunk_size, layer_norm_epsilon=d.eps,
        use_conv_bias=case["conv_bias"], use_bias=case["bias"], hidden_act=cfg.get("hidden_act", "silu"),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)))


class Mamba2StackTask(StateTask):
    """Cases, weights, pools and fuzz of a stack of Mamba-2 layers; subclasses add the inputs and
    outputs of their level (``extra_params`` per case)."""
    fuzz_dtypes = ("bf16",)  # the served dtype
    cpu_steps = CPU_STEPS
    # Full profile: the model's captured steps with their shares (the layer task); a stack whose
    # every token's logits are an output keeps its hand-picked steps (see the L4 task).
    captured_steps = False

    def steps(self, chunk: int, profile: str) -> List[Tuple[str, List[Tuple[int, int]]]]:
        return self.cpu_steps if profile == "cpu" else batches(chunk, profile)

    def extra_params(self, model: str, profile: str) -> dict:
        return {}

    def case_params(self, model, dims, seqs, profile):
        return dict(MambaMixer2Task._params(model, dims, seqs), **self.extra_params(model, profile))

    def cases(self, profile):
        out = []
        for model in MAMBA2_MODELS:
            dims, dt = mamba2_dims(model, profile), model_dtype(model)
            hand = self.steps(dims.chunk_size, profile)
            steps = (captured_layer_step_seqs(model, profile, hand) if self.captured_steps
                     else [(name, seqs, 1.0, "hand-picked") for name, seqs in hand])
            for name, seqs, weight, source in steps:
                params = dict(self.case_params(model, dims, seqs, profile), source=source)
                out.append(Case(f"{model}-{name}-{DTYPE_NAMES[dt]}", dt, model=model, weight=weight, params=params))
        return out

    def init_weights(self, module, gen):
        # Matrices, conv taps and the embedding at trained scale, norm weights near 1 (DenseTask);
        # each mixer's A, D and dt_bias in the ranges mamba-ssm draws and training keeps.
        DenseTask.init_weights(self, module, gen)
        with torch.no_grad():
            for mixer in module.modules():
                if isinstance(mixer, MambaMixer2):
                    dims = dataclasses.replace(mamba2_dims(MAMBA2_MODELS[0]), num_heads=mixer.A.numel())
                    heads = head_params(dims, gen, mixer.A.device, torch.float32)
                    for name in ("A", "D", "dt_bias"):
                        getattr(mixer, name).copy_(heads[name])

    def state_shapes(self, case):
        d = dims_of(case)
        return (d.conv_kernel - 1, d.conv_dim), (d.num_heads, d.head_dim, d.state_size), INITIAL_STATE_SCALE

    def fuzz_strategy(self, dtype, profile):
        model = MAMBA2_MODELS[0]
        real = mamba2_dims(model, profile)

        @st.composite
        def draw_case(draw):
            # On the CPU a 64-token chunk, so short fuzzed prefills still cross chunk boundaries.
            chunk = 64 if profile == "cpu" else draw(st.sampled_from([real.chunk_size, 64]))
            decodes = draw(st.integers(0, 3 if profile == "cpu" else 64))
            near = [1, chunk - 1, chunk, chunk + 1]
            budget = 96 if profile == "cpu" else 8 * chunk
            queries = draw(st.lists(st.one_of(st.sampled_from(near), st.integers(1, 2 * chunk + 7)),
                                    min_size=0 if decodes else 1, max_size=3))
            while len(queries) > 1 and sum(queries) > budget:
                queries.pop()
            if queries and queries[0] > budget:
                queries = [chunk + 1]
            continues = draw(st.lists(st.booleans(), min_size=len(queries), max_size=len(queries)))
            seqs = [(17 + (53 * i) % 400, 1) for i in range(decodes)]
            seqs += [(draw(st.integers(1, 600)) if c else 0, n) for c, n in zip(continues, queries)]
            groups = draw(st.sampled_from([1, 2] if profile == "cpu" else [1, 8]))
            dims = dataclasses.replace(real, n_groups=groups, chunk_size=chunk)
            flags = "".join("s" if c else "z" for c in continues)
            return Case(f"fuzz-D{decodes}-P{'_'.join(map(str, queries)) or 0}{'-' + flags if flags else ''}"
                        f"-c{chunk}-g{groups}-{DTYPE_NAMES[dtype]}", dtype, model=model,
                        params=self.case_params(model, dims, seqs, profile))

        return draw_case()

    # ---- cost: per layer, the mixer's bytes and FLOPs plus its norm -------------------------------
    def layer_io_bytes(self, case) -> int:
        return MambaMixer2Task.io_bytes(self, case) + dims_of(case).hidden_size * torch.finfo(case.dtype).bits // 8

    def layer_flops(self, case) -> int:
        return MambaMixer2Task.flops(self, case) + 4 * sum(case["query"]) * dims_of(case).hidden_size
