"""RotaryEmbedding (vLLM ``RotaryEmbedding``, Llama-3 scaling, partial rotary, GPT-J style).

Production passes ``query`` and ``key`` as column slices of the fused qkv projection output, so
their rows are strided by the whole qkv width; positions come from running sequences (decode: one
position per sequence anywhere in its context; prefill: a contiguous run from a chunk's start).
"""
import torch
from hypothesis import strategies as st

from fk_pytest import Case, Task, standard_tests
from fk_pytest.fuzz import token_counts
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L1.rotary_emb import RotaryEmbedding

from ..configs import head_dim, load_config, rotary_dim
from ..workload import (DTYPE_SWEEP, HAND_PICKED_WEIGHT, LLAMA_FAMILY, activations, fuzz_cap, model_dtype,
                        token_cases)
from ..workloads import load_capture

ROPE_MODELS = LLAMA_FAMILY + ("gpt-j-6b", "phi-2")  # + interleaved style, + partial rotary
CONTEXT_CAP = 32768  # decode positions are drawn from contexts up to this length


def captured_layout(model: str) -> str:
    """How the model's captured RoPE calls pass q/k: column slices of the fused qkv output (rows
    strided by its width), or contiguous (Qwen3: the per-head q/k norms write new tensors)."""
    capture = load_capture(model)
    if capture is None:
        return "qkv-split"
    for scenario in capture["scenarios"].values():
        for group in scenario["modules"]:
            if group["class"] == "RotaryEmbedding":
                query = group["args"]["query"]
                return "qkv-split" if query["stride"][0] > query["shape"][1] else "contiguous"
    return "qkv-split"


def rope_params(cfg) -> dict:
    return dict(head_size=head_dim(cfg), rotary_dim=rotary_dim(cfg),
                max_pos=cfg["max_position_embeddings"], base=float(cfg["rope_theta"]),
                neox=cfg.get("rope_is_neox_style", True), scaling=cfg.get("rope_scaling"),
                nq=cfg["num_attention_heads"], nk=cfg["num_key_value_heads"])


class RotaryEmbeddingTask(Task):
    name = "rotary_emb"
    level = 1
    family = "rope"
    module_path = "L1/rotary_emb.py"
    reference = RotaryEmbedding
    may_mutate = ("query", "key")  # vLLM rotates in place and returns the same tensors

    def cases(self, profile):
        out = []
        for model in ROPE_MODELS:
            cfg = load_config(model)
            entries = token_cases(model, profile, "RotaryEmbedding", max_tokens=cfg["max_position_embeddings"])
            for phase, t, weight, source in entries[""]:
                out.append(self._case(model, phase, t, model_dtype(model), cfg, weight, source,
                                      captured_layout(model) if profile == "full" else "qkv-split"))
        model, counts = DTYPE_SWEEP[profile]
        weight = 1.0 if profile == "cpu" else HAND_PICKED_WEIGHT
        for dt in (torch.float16, torch.float32):
            for t in counts:
                out.append(self._case(model, "sweep", t, dt, load_config(model), weight))
        return out

    def _case(self, model, phase, t, dt, cfg, weight=1.0, source="hand-picked", layout="qkv-split"):
        params = dict(rope_params(cfg), tokens=t, phase=phase, layout=layout, source=source)
        return Case(f"{model}-{phase}-T{t}-{DTYPE_NAMES[dt]}", dt, model=model, params=params, weight=weight)

    def init_args(self, case):
        return dict(head_size=case["head_size"], rotary_dim=case["rotary_dim"],
                    max_position_embeddings=case["max_pos"], base=case["base"],
                    is_neox_style=case["neox"], rope_scaling=case["scaling"])

    def make_inputs(self, case, gen, device):
        t, hs, nq, nk = case["tokens"], case["head_size"], case["nq"], case["nk"]
        limit = min(case["max_pos"], CONTEXT_CAP)
        if case["phase"] == "prefill" and t <= limit:
            start = int(torch.randint(0, limit - t + 1, (1,), generator=gen, device=device))
            positions = torch.arange(start, start + t, device=device)
        else:
            positions = torch.randint(0, limit, (t,), generator=gen, device=device)
        if case["layout"] == "qkv-split":
            qkv = activations((t, (nq + 2 * nk) * hs), gen, device, case.dtype)
            query, key = qkv[:, : nq * hs], qkv[:, nq * hs: (nq + nk) * hs]
        else:
            query = activations((t, nq * hs), gen, device, case.dtype)
            key = activations((t, nk * hs), gen, device, case.dtype)
        return {"positions": positions, "query": query, "key": key}

    def output_names(self, case):
        return ("query", "key")

    def fuzz_strategy(self, dtype, profile):
        @st.composite
        def draw_case(draw):
            hs = draw(st.sampled_from([64, 80, 96, 128, 256]))
            rot = draw(st.sampled_from([hs, hs // 2, 2 * int(0.2 * hs), 32]))
            nq = draw(st.integers(1, 32))
            nk = draw(st.sampled_from([d for d in range(1, nq + 1) if nq % d == 0]))
            t = fuzz_cap(draw(token_counts(512)), (nq + nk) * hs, profile)
            max_pos = draw(st.sampled_from([2048, 32768, 131072]))
            scaling = draw(st.sampled_from([None, load_config("llama-3.1-8b")["rope_scaling"]]))
            params = dict(head_size=hs, rotary_dim=rot, max_pos=max_pos,
                          base=draw(st.sampled_from([10000.0, 500000.0, 1000000.0])),
                          neox=draw(st.booleans()), scaling=scaling, nq=nq, nk=nk, tokens=t,
                          phase=draw(st.sampled_from(["decode", "prefill"])),
                          layout=draw(st.sampled_from(["qkv-split", "contiguous"])))
            desc = f"hs{hs}-rot{rot}-q{nq}k{nk}-T{t}-{'neox' if params['neox'] else 'gptj'}-{params['layout']}"
            return Case(f"fuzz-{desc}-{DTYPE_NAMES[dtype]}", dtype, params=params)

        return draw_case()

    def io_bytes(self, case):
        # In place: only the rotary features are read and written; plus positions and cos/sin rows.
        t = case["tokens"]
        rotated = 2 * t * (case["nq"] + case["nk"]) * case["rotary_dim"] * torch.finfo(case.dtype).bits // 8
        return rotated + t * 8 + t * case["rotary_dim"] * 4

    def flops(self, case):
        return 3 * case["tokens"] * (case["nq"] + case["nk"]) * case["rotary_dim"]


TASK = RotaryEmbeddingTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
