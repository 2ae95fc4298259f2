"""BertModel (vLLM): a BERT-style text encoder, embeddings then post-norm layers, hidden states out.

``forward(input_ids[T], positions[T], token_type_ids[T] = None) -> hidden_states[T, hidden]`` over a
packed batch whose cu_seqlens are in the forward context; ``positions`` count from 0 within each
sequence (XLM-R's offset is the config's ``position_offset``, added here). Pooling is not part of
the model (``L1/pooler.py``). Serves all-MiniLM-L6-v2 (BERT) and BGE-M3 (XLM-R large).

``load_weights`` takes HF checkpoint names (a ``BertModel`` / ``XLMRobertaModel`` state dict or
safetensors, with or without the ``bert.`` / ``roberta.`` prefix of the task heads' checkpoints):
q/k/v are packed into ``qkv_proj``, every other name is HF's own; the pooler and MLM heads are not
part of this model and are left out.
"""
from typing import Iterable, Iterator, Optional, Tuple

import torch
from torch import nn

from ..bert_config import BertArchConfig
from ..checkpoint import load_checkpoint
from ..L1.layer_norm import LayerNorm
from ..L1.vocab_parallel_embedding import VocabParallelEmbedding
from ..L3.bert_layer import BertLayer
from ..native import LayerStack, run
from ..records import RecordsInit

# HF's separate q/k/v projections, renamed to the fragments the checkpoint loader packs into qkv_proj
_QKV_RENAMES = tuple((f".attention.self.{hf}.", f".attention.self.{ours}.")
                     for hf, ours in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")))
_MODEL_PREFIXES = ("bert.", "roberta.")  # BertFor* / XLMRobertaFor* keep the encoder under these
_NOT_OURS = ("pooler.", "cls.", "lm_head.", "classifier.")  # heads on top of the encoder
_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")  # HF index buffers, not weights


class BertEmbedding(RecordsInit, nn.Module):
    def __init__(self, config: BertArchConfig):
        super().__init__()
        self.position_offset = config.position_offset
        self.word_embeddings = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = VocabParallelEmbedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = VocabParallelEmbedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, input_ids, positions, token_type_ids=None):
        return self._forward(input_ids, positions, token_type_ids, native=False)

    def forward_native(self, input_ids, positions, token_type_ids=None):
        return self._forward(input_ids, positions, token_type_ids, native=True)

    def _forward(self, input_ids, positions, token_type_ids, native):
        if token_type_ids is None:  # a single segment (embedding requests): every token is type 0
            token_type_ids = torch.zeros_like(input_ids)
        # Summed in the activation dtype in HF's order (word + type, then + position), as HF and vLLM do.
        embeddings = run(self.word_embeddings, native, input_ids) + run(self.token_type_embeddings, native,
                                                                        token_type_ids)
        embeddings = embeddings + run(self.position_embeddings, native, positions + self.position_offset)
        return run(self.LayerNorm, native, embeddings)


class BertEncoder(RecordsInit, LayerStack, nn.Module):
    def __init__(self, config: BertArchConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))


class BertModel(RecordsInit, nn.Module):
    def __init__(self, config: BertArchConfig):
        super().__init__()
        if not isinstance(config, BertArchConfig):  # an HF config (object or dict)
            config = BertArchConfig.from_hf(config)
        self.config = config
        self.embeddings = BertEmbedding(config)
        self.encoder = BertEncoder(config)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                token_type_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.encoder(self.embeddings(input_ids, positions, token_type_ids))

    def forward_native(self, input_ids, positions, token_type_ids=None):
        return self.encoder.forward_native(self.embeddings.forward_native(input_ids, positions, token_type_ids))

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> None:
        """HF-named tensors into place (see the module docstring); every parameter must be delivered."""
        load_checkpoint(self, encoder_weights(weights), renames=_QKV_RENAMES)


def encoder_weights(weights: Iterable[Tuple[str, torch.Tensor]]) -> Iterator[Tuple[str, torch.Tensor]]:
    """The encoder's tensors of an HF BERT / XLM-R checkpoint under the names of a bare ``BertModel``:
    the task model's prefix stripped, heads and index buffers left out."""
    for name, tensor in weights:
        for prefix in _MODEL_PREFIXES:
            if name.startswith(prefix):
                name = name[len(prefix):]
                break
        if name.startswith(_NOT_OURS) or name in _BUFFERS:
            continue
        yield name, tensor
