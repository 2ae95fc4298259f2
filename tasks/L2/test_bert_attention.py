"""BertAttention (L2): fused qkv projection, bidirectional attention within each sequence of a packed
batch (cu_seqlens in the forward context), output dense and post-norm add & norm.

The batches are the encoder attention task's: an embedding server's packed sentences, 512-token
documents, one BGE-M3 long document (full profile); a few sentences of under 20 tokens (CPU).
all-MiniLM-L6-v2 (384 wide, 12 x 32 heads) and BGE-M3 / XLM-R large (1024, 16 x 64), served in bf16
and swept in float32 (both checkpoints are float32). ``EncoderBlockTask`` is the shape the BERT
layer and model tasks share: one packed batch in, the forward context set around the call.
"""
import torch
from hypothesis import strategies as st

from fk_pytest import Case, Task, standard_tests
from fk_pytest.fuzz import token_counts
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.bert_config import BertArchConfig
from kernels_reference.forward_context import AttentionMetadata
from kernels_reference.L2.bert_attention import BertAttention

from ..configs import load_config
from ..dense import DenseTask
from ..L1.test_encoder_only_attention import BATCHES, FP32_SWEEP, describe_lengths
from ..workload import HAND_PICKED_WEIGHT, activations, call_with_metadata

MODELS = ("all-minilm-l6-v2", "bge-m3")
FUZZ = {"cpu": dict(max_seqs=2, max_len=16), "full": dict(max_seqs=24, max_len=512)}


def bert_config(model: str, **overrides) -> BertArchConfig:
    cfg = dict(load_config(model), **overrides)
    return BertArchConfig.from_hf(cfg)


class EncoderBlockTask(Task):
    """A module of a BERT-style encoder run on one packed batch: cases from ``batches(profile)``
    ({model: ((name, lengths), ...)}) plus the float32 sweep, the batch's metadata in the context."""

    family = "layer"
    fuzz_dtypes = ("bf16", "fp32")  # served in bf16; float32 as sentence-transformers runs them
    init_weights = DenseTask.init_weights  # trained scale: N(0, 1/fan_in) matrices, gains ~1, small biases

    def batches(self, profile):
        return BATCHES[profile]

    def fp32_batches(self, profile):
        return FP32_SWEEP[profile]

    def case_params(self, model: str, profile: str) -> dict:
        """Per-model parameters beyond the lengths (the model task's depth and vocabulary cut)."""
        return {}

    def cases(self, profile):
        out = []
        for model, batches in self.batches(profile).items():
            weight = 1.0 if profile == "cpu" else 1.0 / len(batches)  # 1 per model
            out += [self._case(model, profile, name, lens, torch.bfloat16, weight) for name, lens in batches]
        weight = 1.0 if profile == "cpu" else HAND_PICKED_WEIGHT
        for model, batches in self.fp32_batches(profile).items():
            out += [self._case(model, profile, name, lens, torch.float32, weight) for name, lens in batches]
        return out

    def _case(self, model, profile, name, lengths, dt, weight):
        return Case(f"{model}-{name}-{DTYPE_NAMES[dt]}", dt, model=model, weight=weight,
                    params=dict(self.case_params(model, profile), lengths=list(lengths)))

    def metadata(self, case, device):
        lengths = case["lengths"]
        return AttentionMetadata.build([0] * len(lengths), lengths, block_size=16, device=device)

    def hidden_inputs(self, case, gen, device):
        """A layer's input: the previous LayerNorm's output, unit scale with outlier channels."""
        hidden = load_config(case.model)["hidden_size"]
        return {"hidden_states": activations((sum(case["lengths"]), hidden), gen, device, case.dtype),
                "metadata": self.metadata(case, device)}

    def call(self, module, inputs, method=None):
        return call_with_metadata(module, inputs, method)

    def fuzz_strategy(self, dtype, profile):
        limits = FUZZ[profile]

        @st.composite
        def draw_case(draw):
            model = draw(st.sampled_from(MODELS))
            n = draw(st.integers(1, limits["max_seqs"]))
            lengths = [draw(token_counts(limits["max_len"])) for _ in range(n)]
            params = dict(self.case_params(model, profile), lengths=lengths)
            return Case(f"fuzz-{model}-{describe_lengths(lengths)}-{DTYPE_NAMES[dtype]}", dtype, model=model,
                        params=params)

        return draw_case()

    # ---- cost ---------------------------------------------------------------------------------------
    def attention_flops(self, case) -> int:
        """q.k and p.v over each sequence's pairs, all heads."""
        return 4 * load_config(case.model)["hidden_size"] * sum(n * n for n in case["lengths"])

    def element_bytes(self, case) -> int:
        return torch.finfo(case.dtype).bits // 8


class BertAttentionTask(EncoderBlockTask):
    name = "bert_attention"
    level = 2
    family = "attention"
    module_path = "L2/bert_attention.py"
    reference = BertAttention

    def init_args(self, case):
        c = bert_config(case.model)
        return dict(hidden_size=c.hidden_size, num_attention_heads=c.num_attention_heads,
                    layer_norm_eps=c.layer_norm_eps)

    def make_inputs(self, case, gen, device):
        return self.hidden_inputs(case, gen, device)

    def io_bytes(self, case):
        h, t = load_config(case.model)["hidden_size"], sum(case["lengths"])
        return (4 * h * h + 2 * t * h) * self.element_bytes(case)  # qkv and output weights, rows in and out

    def flops(self, case):
        h, t = load_config(case.model)["hidden_size"], sum(case["lengths"])
        return 2 * t * 4 * h * h + self.attention_flops(case)


TASK = BertAttentionTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
