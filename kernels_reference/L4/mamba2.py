"""Mamba2ForCausalLM (vLLM): embeddings, Mamba-2 layers, ``norm_f``, and the LM head (tied to the
embeddings in mamba2-2.7b).

``forward(input_ids[T], positions[T]) -> hidden_states[T, hidden]`` over a packed step whose metadata
(query_start_loc, seq_lens, state_slots) is in the forward context; ``compute_logits(hidden_states)
-> [T, vocab]``. Positions are taken for the engine's uniform call and not read: a state-space model
has no position encoding.

State. Each layer's mixer binds its own pools, ``state_cache = (conv_states [slots, K - 1, conv_dim]
in the model dtype, ssm_states [slots, H, P, N] float32)``; a sequence keeps one slot index across
all layers. :meth:`Mamba2ForCausalLM.allocate_state_pools` makes and binds them for a number of
slots. What an engine must add: hand each sequence a slot when it starts and free it when it ends
(no zeroing: a fresh sequence, ``has_initial_state`` false, never reads its slot), put the slots in
the step's metadata (``state_slots``) in the batch's order with decodes first, and keep the slot
across the chunks of a chunked prefill (the states carry between them). Preemption loses the
state; the sequence is recomputed from its tokens.

Checkpoints (HF / mamba-ssm names, as vLLM loads them): ``backbone.embeddings`` (mamba-ssm's
``backbone.embedding``), ``backbone.layers.{i}.norm``, ``backbone.layers.{i}.mixer.*`` with ``A_log``
stored as ``A = -exp(A_log)`` in float32, ``backbone.norm_f``, and ``lm_head`` unless tied.
"""
from typing import Iterable, Iterator, List, Tuple

import torch
from torch import nn

from ..checkpoint import load_checkpoint
from ..L1.rms_norm import RMSNorm
from ..L1.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from ..L3.mamba2_decoder_layer import Mamba2ArchConfig, Mamba2DecoderLayer
from ..native import run
from ..records import RecordsInit
from ..state_pools import bind_state_pools


class Mamba2Model(RecordsInit, nn.Module):
    def __init__(self, config: Mamba2ArchConfig):
        super().__init__()
        self.embeddings = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Mamba2DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm_f = RMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)

    def forward(self, input_ids, positions):
        return self._forward(input_ids, native=False)

    def forward_native(self, input_ids, positions):
        return self._forward(input_ids, native=True)

    def _forward(self, input_ids, native):
        hidden_states, residual = run(self.embeddings, native, input_ids), None
        for layer in self.layers:
            hidden_states, residual = run(layer, native, hidden_states, residual)
        hidden_states, _ = run(self.norm_f, native, hidden_states, residual)
        return hidden_states


class Mamba2ForCausalLM(RecordsInit, nn.Module):
    config_class = Mamba2ArchConfig

    def __init__(self, config: Mamba2ArchConfig):
        super().__init__()
        config = Mamba2ArchConfig.from_hf(config)
        self.config = config
        self.backbone = Mamba2Model(config)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.backbone.embeddings.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.backbone(input_ids, positions)

    def forward_native(self, input_ids, positions):
        return self.backbone.forward_native(input_ids, positions)

    def compute_logits(self, hidden_states: torch.Tensor, native: bool = False) -> torch.Tensor:
        return run(self.lm_head, native, hidden_states)

    # ---- state pools ----------------------------------------------------------------------------
    def mixers(self) -> List[nn.Module]:
        """The modules that own a layer's state pools, in layer order."""
        return [layer.mixer for layer in self.backbone.layers]

    def state_shapes(self) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
        """(conv window, SSM state) of one slot of one layer."""
        c = self.config
        conv_dim = c.intermediate_size + 2 * c.n_groups * c.state_size
        return (c.conv_kernel - 1, conv_dim), (c.num_heads, c.head_dim, c.state_size)

    def allocate_state_pools(self, num_slots: int, dtype=None, device=None) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        """Make every layer's (conv_states, ssm_states) pools of ``num_slots`` slots and bind them;
        the conv windows in ``dtype`` (default: the model's), the SSM states in float32. Returned
        in layer order. The contents start as zeros but are never read by a fresh sequence."""
        weight = self.lm_head.weight
        dtype, device = dtype or weight.dtype, device or weight.device
        return bind_state_pools(self.mixers(), num_slots, *self.state_shapes(), dtype, device)

    # ---- weights ------------------------------------------------------------------------------
    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> None:
        """HF / mamba-ssm named tensors into place; ``A_log`` becomes ``A = -exp(A_log)``."""
        skip = ("lm_head.weight",) if self.config.tie_word_embeddings else ()
        load_checkpoint(self, _vllm_names(weights), renames=(("backbone.embedding.", "backbone.embeddings."),),
                        skip=skip)


def _vllm_names(weights: Iterable[Tuple[str, torch.Tensor]]) -> Iterator[Tuple[str, torch.Tensor]]:
    """The checkpoint's ``A_log`` as the ``A`` the kernels read (in float32, before any cast to the
    parameter's dtype), every other tensor as stored."""
    for name, tensor in weights:
        if name.endswith(".A_log"):
            yield name[: -len("A_log")] + "A", -torch.exp(tensor.float())
        else:
            yield name, tensor
