"""Our BertModel reproduces HF transformers' BertModel and XLMRobertaModel (tiny random configs,
float64): the HF checkpoint loaded by name (q/k/v packed), a padded HF batch with its attention mask
against our packed batch with cu_seqlens in the forward context, valid rows compared."""
import pytest
import torch

transformers = pytest.importorskip("transformers")

from kernels_reference.forward_context import AttentionMetadata, set_forward_context  # noqa: E402
from kernels_reference.L4.bert import BertModel  # noqa: E402

COMMON = dict(vocab_size=101, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=80,
              hidden_act="gelu", layer_norm_eps=1e-12, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
CONFIGS = {
    "bert": lambda: transformers.BertConfig(**COMMON, max_position_embeddings=40, type_vocab_size=2),
    # XLM-R numbers positions from pad_token_id + 1: the table has two rows below the first position
    "xlm-roberta": lambda: transformers.XLMRobertaConfig(**COMMON, max_position_embeddings=42, type_vocab_size=1,
                                                         pad_token_id=1),
}
MODELS = {"bert": transformers.BertModel, "xlm-roberta": transformers.XLMRobertaModel}
LENGTHS = (9, 3, 14, 1)


def _hf_and_ours(arch):
    torch.manual_seed(0)
    config = CONFIGS[arch]()
    hf = MODELS[arch](config, add_pooling_layer=True).double().eval()
    with torch.no_grad():  # HF starts norms at ones and biases at zeros: move every parameter
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    ours = BertModel(config).double().eval()
    ours.load_weights(hf.state_dict().items())  # the pooler and HF's index buffers are left out
    return config, hf, ours


def _batch(config, seed=1):
    gen = torch.Generator().manual_seed(seed)
    # ids above the padding id, so XLM-R's own position numbering (which skips padding ids) counts every token
    ids = [torch.randint(2, config.vocab_size, (n,), generator=gen) for n in LENGTHS]
    types = [(torch.arange(n) >= n // 2).long() * (config.type_vocab_size - 1) for n in LENGTHS]  # sentence pairs
    return ids, types


def _hf_padded(hf, config, ids, types):
    width = max(LENGTHS)
    pad = config.pad_token_id or 0
    input_ids = torch.full((len(ids), width), pad, dtype=torch.long)
    token_types = torch.zeros((len(ids), width), dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for b, (i, t) in enumerate(zip(ids, types)):
        input_ids[b, :len(i)], token_types[b, :len(i)], mask[b, :len(i)] = i, t, 1
    with torch.no_grad():
        out = hf(input_ids=input_ids, attention_mask=mask, token_type_ids=token_types).last_hidden_state
    return [out[b, :n] for b, n in enumerate(LENGTHS)]


@pytest.mark.parametrize("arch", list(CONFIGS))
@pytest.mark.parametrize("method", ["forward", "forward_native"])
def test_packed_batch_matches_hf_padded_batch_in_float64(arch, method):
    config, hf, ours = _hf_and_ours(arch)
    ids, types = _batch(config)
    want = _hf_padded(hf, config, ids, types)
    meta = AttentionMetadata.build([0] * len(LENGTHS), list(LENGTHS), block_size=16)
    with torch.no_grad(), set_forward_context(meta):
        got = getattr(ours, method)(torch.cat(ids), meta.positions(), torch.cat(types))
    assert got.shape == (sum(LENGTHS), config.hidden_size) and got.dtype == torch.float64
    first = 0
    for n, rows in zip(LENGTHS, want):
        torch.testing.assert_close(got[first:first + n], rows, rtol=1e-10, atol=1e-10)
        first += n


def test_token_types_default_to_the_first_segment():
    config, hf, ours = _hf_and_ours("bert")
    ids, _ = _batch(config)
    meta = AttentionMetadata.build([0] * len(LENGTHS), list(LENGTHS), block_size=16)
    with torch.no_grad(), set_forward_context(meta):
        implicit = ours(torch.cat(ids), meta.positions())
        explicit = ours(torch.cat(ids), meta.positions(), torch.zeros(sum(LENGTHS), dtype=torch.long))
    torch.testing.assert_close(implicit, explicit, rtol=0, atol=0)


def test_checkpoint_missing_a_weight_is_refused():
    config, hf, ours = _hf_and_ours("bert")
    weights = {k: v for k, v in hf.state_dict().items() if not k.endswith("layer.1.attention.self.key.bias")}
    with pytest.raises(KeyError, match="qkv_proj.bias"):
        BertModel(config).double().load_weights(weights.items())


def test_task_model_prefix_is_stripped():
    """A BertForMaskedLM-style checkpoint (``bert.`` prefix, an MLM head) loads into the encoder."""
    config, hf, ours = _hf_and_ours("bert")
    prefixed = [(f"bert.{k}", v) for k, v in hf.state_dict().items()] + [("cls.predictions.bias", torch.zeros(3))]
    again = BertModel(config).double()
    again.load_weights(prefixed)
    for (name, a), b in zip(again.state_dict().items(), ours.state_dict().values()):
        assert torch.equal(a, b), name
