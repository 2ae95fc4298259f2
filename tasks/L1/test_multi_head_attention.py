"""MultiHeadAttention (vLLM's cache-free attention of vision towers): bidirectional attention over a
padded batch ``[B, S, heads * d]``, every token attending to every token of its image; with a
key-padding mask, Hugging Face BERT's padded batch of sentences.

Images: one (a request) or 32 (a batch) of DINOv2-S's 257 tokens at 224 px or 1025 at 448 px
(patch 14, class token included; 6 heads x 64) and SigLIP-2 so400m's 729 patches at 384 px
(16 heads x 72). Text: a batch of sentences right-padded to its longest (the mask marks the real
tokens) for MiniLM-L6 (12 x 32) and BGE-M3 (16 x 64). Served in bf16; DINOv2 (torch hub) and
sentence-transformers also run float32, swept on a few batches.

Padded query rows are not scored (pooling discards them): they are left out of the comparison as
undetermined rows, so a kernel may write any finite value there (but must write one). A batch of short sentences padded
to one long one can be mostly padding, hence the higher ``max_excluded_share``.
"""
import torch
from hypothesis import strategies as st

from fk_pytest import Case, Task, standard_tests
from fk_pytest.fuzz import token_counts
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L1.encoder_attention import MultiHeadAttention

from ..configs import head_dim, load_config
from ..workload import HAND_PICKED_WEIGHT, activations
from .test_encoder_only_attention import REAL_HEADS, SENTENCES_B32, describe_lengths

DOCUMENTS_B8 = (512, 512, 300, 512, 77, 512, 451, 512)  # passages cut at the 512-token window, a few shorter
# (name, batch, tokens, real lengths or None for no padding) per model and profile. CPU: a 56 px
# DINOv2 image (1 + 4 x 4 tokens), 3 x 3 SigLIP patches, a few sentences of under 15 tokens.
BATCHES = {
    "cpu": {"dinov2-small": (("batch-B2-S17", 2, 17, None),),
            "siglip2-so400m-vision": (("image-B1-S9", 1, 9, None),),
            "all-minilm-l6-v2": (("padded-B3-S13", 3, 13, (13, 7, 4)),)},
    "full": {"dinov2-small": (("image-B1-S257", 1, 257, None), ("batch-B32-S257", 32, 257, None),
                              ("batch-B32-S1025", 32, 1025, None)),
             "siglip2-so400m-vision": (("image-B1-S729", 1, 729, None), ("batch-B32-S729", 32, 729, None)),
             "all-minilm-l6-v2": (("padded-B32-S128", 32, 128, SENTENCES_B32), ("padded-B8-S512", 8, 512, DOCUMENTS_B8)),
             "bge-m3": (("padded-B32-S128", 32, 128, SENTENCES_B32), ("padded-B8-S512", 8, 512, DOCUMENTS_B8))},
}
FP32_SWEEP = {"cpu": {"bge-m3": (("padded-B2-S11", 2, 11, (11, 6)),)},
              "full": {"dinov2-small": (("batch-B32-S257", 32, 257, None),),
                       "bge-m3": (("padded-B32-S128", 32, 128, SENTENCES_B32),)}}
# Fuzzed heads: REAL_HEADS of the encoder_only_attention task, without GQA, which no vision tower
# of this family uses. The CPU keeps at most 4 heads (interpreted kernels).
FUZZ = {"cpu": dict(max_batch=3, max_len=40, max_heads=4), "full": dict(max_batch=32, max_len=1100, max_heads=64)}


class MultiHeadAttentionTask(Task):
    name = "multi_head_attention"
    level = 1
    family = "attention"
    module_path = "L1/encoder_attention.py"
    reference = MultiHeadAttention
    fuzz_dtypes = ("bf16", "fp32")  # served in bf16; float32 as torch hub and sentence-transformers run them
    # Padding rows are left out (module docstring); every batch has an entry that fills it, so at
    # most (B - 1) / B of the rows go: 31/32 for a fuzzed batch of one long and 31 one-token entries.
    max_excluded_share = 0.99

    def cases(self, profile):
        out = []
        for model, batches in BATCHES[profile].items():
            weight = 1.0 if profile == "cpu" else 1.0 / len(batches)  # 1 per model
            out += [self._case(model, *batch, torch.bfloat16, weight) for batch in batches]
        weight = 1.0 if profile == "cpu" else HAND_PICKED_WEIGHT
        for model, batches in FP32_SWEEP[profile].items():
            out += [self._case(model, *batch, torch.float32, weight) for batch in batches]
        return out

    def _case(self, model, name, batch, tokens, lengths, dt, weight):
        cfg = load_config(model)
        nq = cfg["num_attention_heads"]
        return Case(f"{model}-{name}-{DTYPE_NAMES[dt]}", dt, model=model, weight=weight,
                    params=dict(batch=batch, tokens=tokens, lengths=None if lengths is None else list(lengths),
                                num_heads=nq, num_kv_heads=nq, head_size=head_dim(cfg)))

    def init_args(self, case):
        d = case["head_size"]
        return dict(num_heads=case["num_heads"], head_size=d, scale=d ** -0.5, num_kv_heads=case["num_kv_heads"])

    def make_inputs(self, case, gen, device):
        nq, nk, d = case["num_heads"], case["num_kv_heads"], case["head_size"]
        b, s = case["batch"], case["tokens"]
        qkv = activations((b, s, (nq + 2 * nk) * d), gen, device, case.dtype)  # q, k, v: slices of qkv
        inputs = {"query": qkv[..., : nq * d], "key": qkv[..., nq * d: (nq + nk) * d], "value": qkv[..., (nq + nk) * d:]}
        if case["lengths"] is not None:  # right padding, as BERT's tokenizers pad
            lengths = torch.tensor(case["lengths"], device=device)
            inputs["attention_mask"] = torch.arange(s, device=device)[None, :] < lengths[:, None]
        return inputs

    def undetermined_rows(self, case, inputs, truth_module, reference=None):
        mask = inputs.get("attention_mask")
        if mask is None:
            return None
        return lambda: {"out": ~mask}  # padded query rows: any finite value will do

    def fuzz_strategy(self, dtype, profile):
        limits = FUZZ[profile]

        @st.composite
        def draw_case(draw):
            nq, d = draw(st.sampled_from(REAL_HEADS))
            nq = min(nq, limits["max_heads"])
            b = draw(st.integers(1, limits["max_batch"]))
            s = draw(token_counts(limits["max_len"]))
            lengths = None
            if draw(st.booleans()):  # a padded batch: one entry fills it, the others are shorter
                lengths = [s] + [draw(st.integers(1, s)) for _ in range(b - 1)]
            params = dict(batch=b, tokens=s, lengths=lengths, num_heads=nq, num_kv_heads=nq, head_size=d)
            padding = "" if lengths is None else "-" + describe_lengths(lengths)
            return Case(f"fuzz-B{b}-S{s}{padding}-h{nq}x{d}-{DTYPE_NAMES[dtype]}", dtype, params=params)

        return draw_case()

    def io_bytes(self, case):
        b, s, d = case["batch"], case["tokens"], case["head_size"]
        per_token = 2 * case["num_heads"] * d + 2 * case["num_kv_heads"] * d  # q in, out; k, v in
        mask = b * s if case["lengths"] is not None else 0  # one byte a key
        return b * s * per_token * torch.finfo(case.dtype).bits // 8 + mask

    def flops(self, case):
        # q.k and p.v over the padded square, which is what a padded batch computes
        return 4 * case["num_heads"] * case["head_size"] * case["batch"] * case["tokens"] ** 2


TASK = MultiHeadAttentionTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
