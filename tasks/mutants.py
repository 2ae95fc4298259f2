"""Built-in bugs of the reference stack, run inside every end-to-end case.

An end-to-end case only counts when it can see bugs that a kernel-level task catches: each mutant
below is the reference with one realistic kernel mistake, composed into the model exactly as a
candidate would be (same weights, same engine path). Three kinds (:class:`fk_pytest.e2e.Mutant`):

* **gross**: a bug that breaks the model (credit must reach 0);
* **graded**: a subtle numerical mistake whose discrepancy on a trained model is small but real
  (the case must fail it: credit below the valid 0.9). Near-tied random-weight logits cannot see
  such bugs, so they apply to the trained model's cases only;
* **decode-path**: right on a packed prompt, wrong on a decode step (one token per sequence after
  its prompt): invisible to prefill-forced scoring, the reason decode-forced scoring exists.

A case in which an applicable mutant is not caught is INSENSITIVE (see :mod:`fk_pytest.e2e`). Each
mutant runs the reference's own code path (fast path on CUDA, native on the CPU) apart from its
one mistake; the decode-path ones change only what the step's forward context says about decode
tokens, so they run inside the captured CUDA graphs as well.
"""
import dataclasses
from typing import List, Optional, Union

import torch

from fk_pytest.e2e import DECODE_PATH, GRADED, Mutant
from kernels_reference.forward_context import AttentionMetadata, get_forward_context, set_forward_context
from kernels_reference.L1.attention import Attention
from kernels_reference.L1.mla_attention import MLAAttention

from kernels_reference.L1.deepseek_rotary_emb import DeepseekScalingRotaryEmbedding
from kernels_reference.L1.rms_norm import RMSNorm
from kernels_reference.L1.rotary_emb import RotaryEmbedding
from kernels_reference.L1.silu_and_mul import SiluAndMul
from kernels_reference.L1.topk_softmax import TopKSoftmax


class RopeIgnoresPositions(RotaryEmbedding):
    """Rotates every token as if it sat at position 0 (i.e. not at all): no position information."""

    def forward(self, positions, query, key):
        return super().forward(torch.zeros_like(positions), query, key)


class DeepseekRopeIgnoresPositions(DeepseekScalingRotaryEmbedding):
    """DeepSeek's YaRN RoPE with the same mistake: every token rotated as if at position 0."""

    def forward(self, positions, query, key):
        return super().forward(torch.zeros_like(positions), query, key)


class RmsNormReturnsOldResidual(RMSNorm):
    """Fused add + RMSNorm that normalises x + residual but hands back the residual it was given,
    so the residual stream never accumulates the layers' outputs."""

    def forward(self, x, residual=None):
        if residual is None:
            return super().forward(x)
        out, _ = super().forward(x, residual.clone())  # the fast path may update its inputs in place
        return out, residual


class SiluAndMulHalvesSwapped(SiluAndMul):
    """silu(up) * gate instead of silu(gate) * up: the two halves of gate_up read the wrong way."""

    def forward(self, x):
        d = x.shape[-1] // 2
        return super().forward(torch.cat([x[..., d:], x[..., :d]], dim=-1))


class TopKExpertOffByOne(TopKSoftmax):
    """Picks the right experts and weights but reports each id one too high (mod E): an
    off-by-one between the router's expert numbering and the expert weights' order."""

    def forward(self, gating_output):
        weights, ids = super().forward(gating_output)
        return weights, ((ids + 1) % gating_output.shape[-1]).to(ids.dtype)


# ---- graded: small numerical mistakes ----------------------------------------------------------
class RmsNormEpsilonTooLarge(RMSNorm):
    """The epsilon under the square root a thousand times the config's (a hard-coded 1e-3 where
    the model says 1e-6, or eps added after the rsqrt's scaling): small rows are under-scaled."""

    FACTOR = 1e3

    def forward(self, x, residual=None):
        eps = self.variance_epsilon
        self.variance_epsilon = eps * self.FACTOR
        try:
            return super().forward(x, residual)
        finally:
            self.variance_epsilon = eps


class AttentionScaleOff(Attention):
    """Softmax scale 10% too small (e.g. 1/sqrt of a padded head size, or a scale meant for
    another head dimension): attention a little too flat everywhere."""

    FACTOR = 0.9

    def forward(self, query, key, value):
        scale = self.scale
        self.scale = scale * self.FACTOR
        try:
            return super().forward(query, key, value)
        finally:
            self.scale = scale


# ---- decode-path: right in prefill, wrong on decode steps ---------------------------------------
DecodeTokens = Union[None, str, torch.Tensor]  # None: no decode token; "all"; or a bool mask per token


def _decoding_sequences(meta: AttentionMetadata) -> List[bool]:
    """Per sequence, from the host lengths: one query token after cached context."""
    return [q == 1 and n > 1 for q, n in zip(meta.query_lens_cpu, meta.seq_lens_cpu)]


def decode_tokens(meta: Optional[AttentionMetadata]) -> DecodeTokens:
    """Which of the step's tokens are decode tokens (one query token of a sequence with context).

    A step of one token per sequence is all decode (the padded CUDA-graph path: its host lengths
    are not valid during capture, and the graphs replay whatever was captured); a mixed step is
    told apart per sequence from its host lengths (eager only)."""
    if meta is None or not meta.query_lens_cpu:
        return None
    if all(q == 1 for q in meta.query_lens_cpu):
        return "all"
    per_seq = _decoding_sequences(meta)
    if not any(per_seq):
        return None
    mask = [d for d, q in zip(per_seq, meta.query_lens_cpu) for _ in range(q)]
    return torch.tensor(mask, device=meta.slot_mapping.device)


def _sequence_mask(meta: AttentionMetadata, which: DecodeTokens) -> torch.Tensor:
    """Per sequence, whether it decodes (``which`` not None)."""
    if isinstance(which, str):
        return torch.ones_like(meta.seq_lens, dtype=torch.bool)
    return torch.tensor(_decoding_sequences(meta), device=meta.seq_lens.device)


def _cache_slots(kv_cache) -> int:
    first = kv_cache[0] if isinstance(kv_cache, (tuple, list)) else kv_cache
    return first.shape[0] * first.shape[1]


class _DecodeSlotOffByOne:
    """The decode-token KV store one slot too far (an offset computed from the new length instead
    of the old one): the token's key/value land where the next token belongs, its own slot keeps
    whatever was there."""

    def forward(self, *args):
        meta = get_forward_context()
        which = decode_tokens(meta)
        if which is None or self.kv_cache is None:
            return super().forward(*args)
        slots = meta.slot_mapping
        shifted = (slots + 1).clamp(max=_cache_slots(self.kv_cache) - 1)
        moved = slots >= 0 if isinstance(which, str) else (slots >= 0) & which
        with set_forward_context(dataclasses.replace(meta, slot_mapping=torch.where(moved, shifted, slots))):
            return super().forward(*args)


class _DecodeReadsOneShort:
    """Paged decode that attends to one token fewer than the sequence holds (a length taken
    before the step's own token was counted): the newest key/value is never read."""

    def forward(self, *args):
        meta = get_forward_context()
        which = decode_tokens(meta)
        if which is None:
            return super().forward(*args)
        decoding = _sequence_mask(meta, which)
        lens = torch.where(decoding, (meta.seq_lens - 1).clamp(min=0), meta.seq_lens).to(meta.seq_lens.dtype)
        lens_cpu = tuple(n - d for n, d in zip(meta.seq_lens_cpu, _decoding_sequences(meta)))
        with set_forward_context(dataclasses.replace(meta, seq_lens=lens, seq_lens_cpu=lens_cpu)):
            return super().forward(*args)


class KvStoreDecodeSlotOffByOne(_DecodeSlotOffByOne, Attention):
    __doc__ = _DecodeSlotOffByOne.__doc__


class MlaStoreDecodeSlotOffByOne(_DecodeSlotOffByOne, MLAAttention):
    __doc__ = _DecodeSlotOffByOne.__doc__


class PagedDecodeReadsOneShort(_DecodeReadsOneShort, Attention):
    __doc__ = _DecodeReadsOneShort.__doc__


class MlaDecodeReadsOneShort(_DecodeReadsOneShort, MLAAttention):
    __doc__ = _DecodeReadsOneShort.__doc__


class _RopeWrongInDecode:
    """Rotates decode tokens as if at position 0 (positions read from a buffer the decode path
    never fills) while prompt tokens are rotated right."""

    def forward(self, positions, query, key):
        which = decode_tokens(get_forward_context())
        if which is None:
            return super().forward(positions, query, key)
        zeroed = torch.zeros_like(positions) if isinstance(which, str) else \
            torch.where(which, torch.zeros_like(positions), positions)
        return super().forward(zeroed, query, key)


class RopeWrongInDecode(_RopeWrongInDecode, RotaryEmbedding):
    __doc__ = _RopeWrongInDecode.__doc__


class DeepseekRopeWrongInDecode(_RopeWrongInDecode, DeepseekScalingRotaryEmbedding):
    __doc__ = _RopeWrongInDecode.__doc__


BUILTIN_MUTANTS = {
    "rope-ignores-positions": Mutant({RotaryEmbedding: RopeIgnoresPositions,
                                      DeepseekScalingRotaryEmbedding: DeepseekRopeIgnoresPositions}),
    "rms-norm-old-residual": Mutant({RMSNorm: RmsNormReturnsOldResidual}),
    "silu-and-mul-halves-swapped": Mutant({SiluAndMul: SiluAndMulHalvesSwapped}),
    # Mixture-of-experts models only (a model without the class records "no module to replace").
    "topk-expert-off-by-one": Mutant({TopKSoftmax: TopKExpertOffByOne}),
    "rms-norm-eps-1000x": Mutant({RMSNorm: RmsNormEpsilonTooLarge}, GRADED),
    "attention-scale-10pct-low": Mutant({Attention: AttentionScaleOff}, GRADED),
    "kv-store-decode-slot-off-by-one": Mutant({Attention: KvStoreDecodeSlotOffByOne,
                                               MLAAttention: MlaStoreDecodeSlotOffByOne}, DECODE_PATH),
    "paged-decode-one-token-short": Mutant({Attention: PagedDecodeReadsOneShort,
                                            MLAAttention: MlaDecodeReadsOneShort}, DECODE_PATH),
    "rope-wrong-in-decode": Mutant({RotaryEmbedding: RopeWrongInDecode,
                                    DeepseekScalingRotaryEmbedding: DeepseekRopeWrongInDecode}, DECODE_PATH),
}


# ---- state models (Mamba-2, Qwen3-Next): the recurrent state a sequence carries between steps ----
from kernels_reference.L1.gated_delta_rule import GatedDeltaRule  # noqa: E402
from kernels_reference.L1.gemma_rms_norm import GemmaRMSNorm  # noqa: E402
from kernels_reference.L1.mamba_chunk_scan import MambaChunkScanCombined  # noqa: E402
from kernels_reference.L1.selective_state_update import SelectiveStateUpdate  # noqa: E402
from kernels_reference.L1.short_convolution import ShortConvolution  # noqa: E402


class GemmaRmsNormReturnsOldResidual(GemmaRMSNorm):
    """Qwen3-Next's zero-centred fused add + RMSNorm with the same mistake as
    :class:`RmsNormReturnsOldResidual`: the residual stream never accumulates the layers' outputs."""

    def forward(self, x, residual=None):
        if residual is None:
            return super().forward(x)
        out, _ = super().forward(x, residual.clone())
        return out, residual


class StateUpdateIgnoresCarriedState(SelectiveStateUpdate):
    """Mamba-2's decode step starting every sequence from a zero SSM state (the slot's state never
    read: a wrong pool pointer or slot index that lands on a cleared row): each decode token sees
    only itself and the conv window. The prompt's chunked scan is untouched."""

    def forward(self, state, x, dt, A, B, C, D=None, z=None, dt_bias=None, state_batch_indices=None):
        if state_batch_indices is None:
            state[:x.shape[0]].zero_()
        else:
            state.index_fill_(0, state_batch_indices.long(), 0.0)
        return super().forward(state, x, dt, A, B, C, D, z, dt_bias, state_batch_indices)


def _decode_call(cu_seqlens: Optional[torch.Tensor], tokens: int) -> bool:
    """Whether a state kernel's call is the step's decode phase: as many sequences as the step's
    leading one-token continuing ones (``state_phases``), one token each."""
    meta = get_forward_context()
    if meta is None or cu_seqlens is None:
        return False
    sequences = cu_seqlens.shape[0] - 1
    if sequences != tokens:
        return False
    if meta.num_decodes is not None:
        return sequences == meta.num_decodes
    return sequences == sum(1 for _ in _leading_decodes(meta))


def _leading_decodes(meta: AttentionMetadata):
    for q, n in zip(meta.query_lens_cpu, meta.seq_lens_cpu):
        if not (q == 1 and n > 1):
            return
        yield q


class DeltaRuleDecodeIgnoresCarriedState(GatedDeltaRule):
    """Qwen3-Next's recurrent decode step starting from a zero state instead of the sequence's
    slot (the decode kernel handed no initial state): right on a packed prompt, each decode token
    then sees only itself and the conv window in the linear-attention layers."""

    def forward(self, q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                use_qk_l2norm_in_kernel=False, cu_seqlens=None):
        if initial_state is not None and _decode_call(cu_seqlens, q.shape[1]):
            initial_state = torch.zeros_like(initial_state)
        return super().forward(q, k, v, g, beta, scale, initial_state, output_final_state,
                               use_qk_l2norm_in_kernel, cu_seqlens)


class ShortConvTapsReversed(ShortConvolution):
    """The causal conv applying its taps in reverse order (weight[k] to x[t - k] instead of
    x[t - (K - 1 - k)]): the window and its state are right, the filter is time-reversed."""

    def forward(self, x, conv_states, query_start_loc=None, cache_indices=None, has_initial_state=None):
        weight = self.weight.data
        self.weight.data = weight.flip(-1)
        try:
            return super().forward(x, conv_states, query_start_loc, cache_indices, has_initial_state)
        finally:
            self.weight.data = weight


class ChunkScanDropsState(MambaChunkScanCombined):
    """Mamba-2's chunked scan returning only the D skip (the SSM's contribution dropped: an output
    buffer never accumulated into), final states right."""

    def forward(self, x, dt, A, B, C, cu_seqlens, D=None, z=None, dt_bias=None, initial_states=None, **kw):
        y, final = super().forward(x, dt, A, B, C, cu_seqlens, D=D, z=z, dt_bias=dt_bias,
                                   initial_states=initial_states, **kw)
        return (x * D[:, None]).to(y.dtype) if D is not None else torch.zeros_like(y), final


class DeltaRuleDropsOutput(GatedDeltaRule):
    """The gated DeltaNet's output zeroed (the kernel writes the state but not o)."""

    def forward(self, *args, **kwargs):
        o, final = super().forward(*args, **kwargs)
        return torch.zeros_like(o), final


STATE_MUTANTS = {
    "gemma-rms-norm-old-residual": Mutant({GemmaRMSNorm: GemmaRmsNormReturnsOldResidual}),
    "short-conv-taps-reversed": Mutant({ShortConvolution: ShortConvTapsReversed}),
    "ssd-scan-drops-state": Mutant({MambaChunkScanCombined: ChunkScanDropsState}),
    "delta-rule-drops-output": Mutant({GatedDeltaRule: DeltaRuleDropsOutput}),
    "state-update-ignores-carried-state": Mutant({SelectiveStateUpdate: StateUpdateIgnoresCarriedState}, DECODE_PATH),
    "delta-rule-decode-ignores-carried-state": Mutant({GatedDeltaRule: DeltaRuleDecodeIgnoresCarriedState},
                                                      DECODE_PATH),
}
