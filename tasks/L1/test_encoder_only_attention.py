"""EncoderOnlyAttention (vLLM's layer of encoder-only text models): bidirectional attention within
each sequence of a packed batch, the boundaries from the forward context's cu_seqlens, no cache.

An embedding server packs what it is sent: a batch of short sentences (queries, passages: 8-128
tokens), documents cut at the 512-token window of BERT-style models, and BGE-M3's long documents
(up to 8192 tokens, one of them filling a step). Heads as the configs say: all-MiniLM-L6-v2 12 x 32,
BGE-M3 (XLM-R large) 16 x 64. Served in bf16; both checkpoints are float32 and sentence-transformers
runs them that way by default, so float32 is swept on a few batches.
"""
import torch
from hypothesis import strategies as st

from fk_pytest import Case, Task, standard_tests
from fk_pytest.fuzz import token_counts
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.forward_context import AttentionMetadata
from kernels_reference.L1.encoder_attention import EncoderOnlyAttention

from ..configs import head_dim, load_config
from ..workload import HAND_PICKED_WEIGHT, activations, call_with_metadata

SENTENCES_B32 = tuple(128 - (37 * i) % 121 for i in range(32))  # 8..128 tokens, a mixed batch of sentences
# (name, sequence lengths) per model and profile. CPU: a few sentences of under 20 tokens.
BATCHES = {
    "cpu": {"all-minilm-l6-v2": (("batch-B3", (7, 13, 5)),), "bge-m3": (("query-T9", (9,)),)},
    "full": {"all-minilm-l6-v2": (("query-T16", (16,)), ("batch-B32", SENTENCES_B32), ("batch-B8-S512", (512,) * 8)),
             "bge-m3": (("query-T16", (16,)), ("batch-B32", SENTENCES_B32), ("batch-B8-S512", (512,) * 8),
                        ("long-T8192", (8192,)))},
}
FP32_SWEEP = {"cpu": {"bge-m3": (("batch-B3", (12, 3, 6)),)},
              "full": {"bge-m3": (("batch-B32", SENTENCES_B32),), "all-minilm-l6-v2": (("batch-B8-S512", (512,) * 8),)}}
# Fuzzed heads, (query heads, head size) of real encoders: MiniLM-L6 12 x 32, DINOv2-S 6 x 64,
# BERT-base 12 x 64, XLM-R large 16 x 64, SigLIP so400m 16 x 72, ViT-H/14 16 x 80, InternViT-6B
# 25 x 128. The CPU keeps at most 4 query heads (interpreted kernels).
REAL_HEADS = ((12, 32), (6, 64), (12, 64), (16, 64), (16, 72), (16, 80), (25, 128))
FUZZ = {"cpu": dict(max_seqs=3, max_len=40, max_heads=4), "full": dict(max_seqs=24, max_len=2048, max_heads=64)}


def describe_lengths(lengths):
    """A case id's part for sequence lengths: each of a few, or count, total and longest of many."""
    if len(lengths) <= 4:
        return "L" + ".".join(map(str, lengths))
    return f"B{len(lengths)}-T{sum(lengths)}-max{max(lengths)}"


def heads_of(model):
    cfg = load_config(model)
    return cfg["num_attention_heads"], head_dim(cfg)


class EncoderOnlyAttentionTask(Task):
    name = "encoder_only_attention"
    level = 1
    family = "attention"
    module_path = "L1/encoder_attention.py"
    reference = EncoderOnlyAttention
    fuzz_dtypes = ("bf16", "fp32")  # served in bf16; float32 as sentence-transformers runs them

    def cases(self, profile):
        out = []
        for model, batches in BATCHES[profile].items():
            weight = 1.0 if profile == "cpu" else 1.0 / len(batches)  # 1 per model
            out += [self._case(model, name, lens, torch.bfloat16, weight) for name, lens in batches]
        weight = 1.0 if profile == "cpu" else HAND_PICKED_WEIGHT
        for model, batches in FP32_SWEEP[profile].items():
            out += [self._case(model, name, lens, torch.float32, weight) for name, lens in batches]
        return out

    def _case(self, model, name, lengths, dt, weight):
        nq, d = heads_of(model)
        return Case(f"{model}-{name}-{DTYPE_NAMES[dt]}", dt, model=model, weight=weight,
                    params=dict(lengths=list(lengths), num_heads=nq, num_kv_heads=nq, head_size=d))

    def init_args(self, case):
        d = case["head_size"]
        return dict(num_heads=case["num_heads"], head_size=d, scale=d ** -0.5, num_kv_heads=case["num_kv_heads"])

    def make_inputs(self, case, gen, device):
        nq, nk, d = case["num_heads"], case["num_kv_heads"], case["head_size"]
        lengths = case["lengths"]
        qkv = activations((sum(lengths), (nq + 2 * nk) * d), gen, device, case.dtype)  # q, k, v: slices of qkv
        meta = AttentionMetadata.build([0] * len(lengths), lengths, block_size=16, device=device)
        return {"query": qkv[:, : nq * d], "key": qkv[:, nq * d: (nq + nk) * d], "value": qkv[:, (nq + nk) * d:],
                "metadata": meta}

    def call(self, module, inputs, method=None):
        return call_with_metadata(module, inputs, method)

    def fuzz_strategy(self, dtype, profile):
        limits = FUZZ[profile]

        @st.composite
        def draw_case(draw):
            nq, d = draw(st.sampled_from(REAL_HEADS))
            nq = min(nq, limits["max_heads"])
            group = draw(st.sampled_from([g for g in (1, 2, 4) if nq % g == 0]))  # GQA off / on
            n = draw(st.integers(1, limits["max_seqs"]))
            lengths = [draw(token_counts(limits["max_len"])) for _ in range(n)]
            params = dict(lengths=lengths, num_heads=nq, num_kv_heads=nq // group, head_size=d)
            desc = f"{describe_lengths(lengths)}-h{nq}x{d}-kv{nq // group}"
            return Case(f"fuzz-{desc}-{DTYPE_NAMES[dtype]}", dtype, params=params)

        return draw_case()

    def io_bytes(self, case):
        t, d = sum(case["lengths"]), case["head_size"]
        per_token = 2 * case["num_heads"] * d + 2 * case["num_kv_heads"] * d  # q in, out; k, v in
        return t * per_token * torch.finfo(case.dtype).bits // 8

    def flops(self, case):
        # q.k and p.v: 2 x 2 x d per (query, key) pair and query head, pairs within each sequence
        return 4 * case["num_heads"] * case["head_size"] * sum(n * n for n in case["lengths"])


TASK = EncoderOnlyAttentionTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
