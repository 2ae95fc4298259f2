"""The architecture facts a BERT-style text encoder needs, read from an HF ``BertConfig`` or
``XLMRobertaConfig`` (object or dict).

BERT (all-MiniLM-L6-v2) and XLM-R (BGE-M3) share one stack: word + position + token-type embeddings
and a LayerNorm, then post-norm layers. They differ in where positions start: XLM-R numbers a
sequence's tokens from ``pad_token_id + 1`` (its padding row sits below them in the table), so
``position_offset`` is 2 there and 0 for BERT; the model adds it to the 0-based positions it is given.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from .model_config import _getter

# HF model types whose position ids start after the padding index (RoBERTa's numbering)
_PADDING_OFFSET_TYPES = ("roberta", "xlm-roberta", "camembert")


@dataclasses.dataclass(frozen=True)
class BertArchConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    layer_norm_eps: float
    max_position_embeddings: int
    type_vocab_size: int = 2
    hidden_act: str = "gelu"
    position_offset: int = 0

    @staticmethod
    def from_hf(config: Any) -> "BertArchConfig":
        get = _getter(config)
        if (get("position_embedding_type", "absolute") or "absolute") != "absolute":
            raise ValueError("only absolute position embeddings are supported")
        offset = get("position_offset", 0)  # already ours (another copy of this class): kept
        if get("model_type", "bert") in _PADDING_OFFSET_TYPES:
            pad = get("pad_token_id", 1)
            offset = (1 if pad is None else pad) + 1
        return BertArchConfig(
            vocab_size=get("vocab_size"), hidden_size=get("hidden_size"),
            num_hidden_layers=get("num_hidden_layers"), num_attention_heads=get("num_attention_heads"),
            intermediate_size=get("intermediate_size"), layer_norm_eps=get("layer_norm_eps", 1e-12),
            max_position_embeddings=get("max_position_embeddings"), type_vocab_size=get("type_vocab_size", 2),
            hidden_act=get("hidden_act", "gelu"), position_offset=offset)
