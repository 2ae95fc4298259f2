"""BertModel (L4): token ids, positions and optional token types in, final hidden states out, over a
packed batch (cu_seqlens in the forward context): all-MiniLM-L6-v2 at its real depth (6 layers) and
width on the full profile, BGE-M3 (XLM-R large, positions offset past the padding id) cut to
``LAYERS["full"]`` layers. CPU: MiniLM cut to 2 layers and its vocabulary sharded by 64 (the float64
truth of the whole table would outweigh the rest); BGE-M3's position offset is checked against HF's
XLM-R in tests/test_hf_bert.py and appears here in the fuzz.

"pair" batches carry token types (a cross-encoder's two segments: type 0, then type 1); the others
are single-segment embedding requests, passed without types, as the pooling server passes them.
"""
import torch

from fk_pytest import standard_tests
from kernels_reference.L4.bert import BertModel

from ..L2.test_bert_attention import EncoderBlockTask, bert_config
from ..L1.test_encoder_only_attention import BATCHES, SENTENCES_B32

LAYERS = {"cpu": {"all-minilm-l6-v2": 2, "bge-m3": 2}, "full": {"all-minilm-l6-v2": 6, "bge-m3": 2}}
VOCAB_SHARD = {"cpu": 64, "full": 1}
MODEL_BATCHES = {
    "cpu": {"all-minilm-l6-v2": (("batch-B3", (7, 13, 5)), ("pair-B2", (11, 6))),
},
    "full": {"all-minilm-l6-v2": BATCHES["full"]["all-minilm-l6-v2"] + (("pair-B32", SENTENCES_B32),),
             "bge-m3": BATCHES["full"]["bge-m3"][:3]},
}
FP32_BATCHES = {"cpu": {}, "full": {"all-minilm-l6-v2": (("batch-B8-S512", (512,) * 8),)}}


class BertModelTask(EncoderBlockTask):
    name = "bert_model"
    level = 4
    family = "model"
    module_path = "L4/bert.py"
    reference = BertModel
    fuzz_dtypes = ("bf16",)

    def batches(self, profile):
        return MODEL_BATCHES[profile]

    def fp32_batches(self, profile):
        return FP32_BATCHES[profile]

    def case_params(self, model, profile):
        return dict(layers=LAYERS[profile][model], vocab_shard=VOCAB_SHARD[profile])

    def _case(self, model, profile, name, lengths, dt, weight):
        case = super()._case(model, profile, name, lengths, dt, weight)
        case.params["segments"] = name.startswith("pair")
        return case

    def config(self, case):
        vocab = bert_config(case.model).vocab_size // case["vocab_shard"]
        return bert_config(case.model, num_hidden_layers=case["layers"], vocab_size=vocab)

    def init_args(self, case):
        return {"config": self.config(case)}

    def make_inputs(self, case, gen, device):
        c, lengths = self.config(case), case["lengths"]
        meta = self.metadata(case, device)
        inputs = {"input_ids": torch.randint(0, c.vocab_size, (sum(lengths),), generator=gen, device=device),
                  "positions": meta.positions(), "token_type_ids": None, "metadata": meta}
        if case.params.get("segments") and c.type_vocab_size > 1:
            second = [torch.arange(n, device=device) >= (n + 1) // 2 for n in lengths]
            inputs["token_type_ids"] = torch.cat(second).long()
        return inputs

    def output_names(self, case):
        return ("hidden_states",)

    def io_bytes(self, case):
        c, t = self.config(case), sum(case["lengths"])
        layer = 4 * c.hidden_size ** 2 + 2 * c.hidden_size * c.intermediate_size
        return (c.num_hidden_layers * layer + 4 * t * c.hidden_size) * self.element_bytes(case)  # 3 rows gathered

    def flops(self, case):
        c, t = self.config(case), sum(case["lengths"])
        layer = 4 * c.hidden_size ** 2 + 2 * c.hidden_size * c.intermediate_size
        return c.num_hidden_layers * (2 * t * layer + self.attention_flops(case))


TASK = BertModelTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
