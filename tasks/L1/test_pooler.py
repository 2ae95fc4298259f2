"""Pooler (vLLM's sequence pooler for ``embed``): one L2-normalised embedding per sequence from an
encoder's packed final hidden states, by mean (all-MiniLM-L6-v2), first token (BGE-M3's CLS) or
last token (Qwen3-Embedding, a decoder), as each model's sentence-transformers config says.

Batches are those of an embedding server: one query, a batch of sentences of mixed lengths, a
full batch of 512-token passages (and for BGE-M3 one 8192-token document). "raw" cases switch the
normalisation off, as a request with ``normalize=False`` does: a mean divided by the wrong count
is invisible once normalised, and only they can see it.
"""
import torch
from hypothesis import strategies as st

from fk_pytest import Case, Task, standard_tests
from fk_pytest.fuzz import real_or_near
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L1.pooler import POOLING_TYPES, Pooler

from ..configs import load_config
from ..workload import CPU_MAX_ELEMENTS, HAND_PICKED_WEIGHT, activations

MODELS = ("all-minilm-l6-v2", "bge-m3", "qwen3-embedding-0.6b")
# Lengths of a batch of 32 sentences, 8 to 128 tokens each (special tokens included)
SENTENCES = (23, 57, 12, 98, 31, 8, 45, 128, 17, 66, 39, 9, 84, 27, 51, 14,
             112, 35, 20, 73, 42, 11, 95, 29, 61, 16, 38, 104, 25, 47, 13, 79)
# (phase, sequence lengths) per profile; the CPU's small batch keeps mixed lengths and a 1-token one.
BATCHES = {
    "cpu": {m: (("query", (7,)), ("sentences", (5, 1, 9, 3))) for m in MODELS},
    "full": {m: (("query", (7,)), ("sentences", SENTENCES), ("passages", (512,) * 8))
             + ((("long", (8192,)),) if m == "bge-m3" else ()) for m in MODELS},
}
# Served in bf16; sentence-transformers runs MiniLM in float32 by default, so it is swept there too.
FP32_SWEEP = {"cpu": {"all-minilm-l6-v2": (("sentences", (5, 1, 9, 3)),)},
              "full": {"all-minilm-l6-v2": (("sentences", SENTENCES), ("passages", (512,) * 8))}}
VARIANTS = ("normalize", "raw")
OTHER_REAL_WIDTHS = (768, 2560, 4096)  # BERT-base-sized encoders, Qwen3-Embedding-4B and -8B


class PoolerTask(Task):
    name = "pooler"
    level = 1
    family = "embedding"  # the embedding model's head, as the LM head is a generator's
    module_path = "L1/pooler.py"
    reference = Pooler

    def cases(self, profile):
        out = []
        for model in MODELS:
            entries = BATCHES[profile][model]
            weight = 1.0 if profile == "cpu" else 1.0 / (len(entries) * len(VARIANTS))  # 1 per model
            for phase, lengths in entries:
                for variant in VARIANTS:
                    out.append(self._case(model, phase, lengths, variant, torch.bfloat16, weight))
        weight = 1.0 if profile == "cpu" else HAND_PICKED_WEIGHT
        for model, entries in FP32_SWEEP[profile].items():
            for phase, lengths in entries:
                for variant in VARIANTS:
                    out.append(self._case(model, phase, lengths, variant, torch.float32, weight))
        return out

    def _case(self, model, phase, lengths, variant, dt, weight):
        cfg = load_config(model)
        suffix = "" if variant == "normalize" else f"-{variant}"
        return Case(f"{model}-{phase}-B{len(lengths)}-T{sum(lengths)}-{cfg['pooling_type'].lower()}{suffix}-"
                    f"{DTYPE_NAMES[dt]}", dt, model=model, weight=weight,
                    params=dict(lengths=tuple(lengths), hidden=cfg["hidden_size"], pooling_type=cfg["pooling_type"],
                                normalize=variant == "normalize", source="hand-picked"))

    def init_args(self, case):
        return {"pooling_type": case["pooling_type"], "normalize": case["normalize"]}

    def make_inputs(self, case, gen, device):
        lengths, h = case["lengths"], case["hidden"]
        # Final hidden states: per-channel offsets (the last LayerNorm's bias and gain) shared by
        # every token, so a sequence's mean does not cancel to noise, plus per-token variation.
        offset = 0.5 * torch.randn(h, generator=gen, device=device)
        x = (activations((sum(lengths), h), gen, device, torch.float32) + offset).to(case.dtype)
        return {"hidden_states": x, "prompt_lens": torch.tensor(lengths, dtype=torch.int64, device=device)}

    def fuzz_strategy(self, dtype, profile):
        widths = sorted({load_config(m)["hidden_size"] for m in MODELS} | set(OTHER_REAL_WIDTHS))
        length = st.one_of(st.sampled_from([1, 2, 3, 7, 127, 129, 512]), st.integers(1, 300))

        @st.composite
        def draw_case(draw):
            hidden = draw(real_or_near(widths))
            lengths = draw(st.lists(length, min_size=1, max_size=40))
            if profile == "cpu":  # the interpreter: keep a case's hidden states small
                lengths = _cap_total(lengths, CPU_MAX_ELEMENTS // hidden)
            params = dict(lengths=tuple(lengths), hidden=hidden, pooling_type=draw(st.sampled_from(POOLING_TYPES)),
                          normalize=draw(st.booleans()))
            return Case(f"fuzz-H{hidden}-B{len(lengths)}-T{sum(lengths)}-{params['pooling_type'].lower()}"
                        f"{'' if params['normalize'] else '-raw'}-{DTYPE_NAMES[dtype]}", dtype, params=params)

        return draw_case()

    def io_bytes(self, case):
        b, h = len(case["lengths"]), case["hidden"]
        rows = sum(case["lengths"]) if case["pooling_type"] == "MEAN" else b  # CLS / LAST read one row each
        return rows * h * torch.finfo(case.dtype).bits // 8 + b * 8 + b * h * 4  # + lengths, float32 out

    def flops(self, case):
        b, h = len(case["lengths"]), case["hidden"]
        pooled = sum(case["lengths"]) * h + b * h if case["pooling_type"] == "MEAN" else 0  # sums, divide
        return pooled + (3 * b * h if case["normalize"] else 0)  # square, sum, scale


def _cap_total(lengths, cap):
    """The leading sequences that fit in ``cap`` tokens (at least one, shortened if it alone does not)."""
    kept, total = [], 0
    for n in lengths:
        if total + n > cap:
            break
        kept.append(n)
        total += n
    return kept or [max(1, min(lengths[0], cap))]


TASK = PoolerTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
