"""Built-in bugs of the encoder stack, run inside every embedding end-to-end case (see
:mod:`tasks.mutants` for why mutants exist and what their kinds mean; there is no decode path here).

Each is one realistic kernel mistake in a class a candidate tree replaces. Measured on the trained
all-MiniLM-L6-v2 over the corpus (float32, CPU, 2026-12-05; retrieval-rank d over 110-425 scored
neighbour positions, the cosine d in brackets):

* gross: attention across the packed batch's sequences (0.71-0.78; cos 0.37), the softmax scale
  1/d instead of 1/sqrt(d) (0.64-0.72; cos 0.41), LayerNorm without its bias (0.61-0.66; cos 0.29),
  a pooler that skips the L2 normalisation (0.56-0.64; cos 0: only retrieval sees it);
* graded: positions off by one (0.39-0.46; cos 0.05), attention that leaves each sequence's last
  key ([SEP]) out (0.11-0.17; cos 2e-3).

Left out because no case can resolve them: GELU's tanh form for the exact one (at most 2 of 425
ranks, cos 9e-7), LayerNorm's eps at 1e-5 for BERT's 1e-12 (0-2 ranks, cos 7e-8), and a mean
pooling that drops each sequence's last token (3-8% of the ranks, cos 7e-4: below a graded
catch on some corpus cuts). Their kernel-level tasks catch them; end to end they change nothing
a retrieval user would see.
"""
import torch

from fk_pytest.e2e import GRADED, Mutant
from kernels_reference.forward_context import get_forward_context
from kernels_reference.L1.dinov2_embeddings import Dinov2PositionEmbedding
from kernels_reference.L1.encoder_attention import (EncoderOnlyAttention, MultiHeadAttention, bidirectional_attention,
                                                     split_heads)
from kernels_reference.L1.layer_norm import LayerNorm
from kernels_reference.L1.patch_embed import PatchEmbed
from kernels_reference.L1.pooler import Pooler
from kernels_reference.L3.dinov2_layer import LayerScale
from kernels_reference.L4.bert import BertEmbedding


class EncoderAttentionAcrossSequences(EncoderOnlyAttention):
    """Varlen attention that ignores cu_seqlens: the packed batch attends as one sequence."""

    def forward(self, query, key, value):
        t = query.shape[0]
        out = bidirectional_attention(split_heads(query, self.num_heads, self.head_size),
                                      split_heads(key, self.num_kv_heads, self.head_size),
                                      split_heads(value, self.num_kv_heads, self.head_size), self.scale)
        return out.reshape(t, -1)


class EncoderAttentionScaleOneOverD(EncoderOnlyAttention):
    """Softmax scale 1/head_size where 1/sqrt(head_size) belongs."""

    def __init__(self, num_heads, head_size, scale, num_kv_heads=None):
        super().__init__(num_heads, head_size, 1.0 / head_size, num_kv_heads)


class EncoderAttentionDropsLastKey(EncoderOnlyAttention):
    """Each sequence attends to all of its keys but the last (a key length one short)."""

    def forward(self, query, key, value):
        meta = get_forward_context()
        lens = meta.query_lens_cpu if meta is not None else (query.shape[0],)
        outs, start = [], 0
        for n in lens:
            keys = max(n - 1, 1)
            outs.append(bidirectional_attention(
                split_heads(query[start:start + n], self.num_heads, self.head_size),
                split_heads(key[start:start + keys], self.num_kv_heads, self.head_size),
                split_heads(value[start:start + keys], self.num_kv_heads, self.head_size), self.scale).reshape(n, -1))
            start += n
        return torch.cat(outs)


class LayerNormDropsBias(LayerNorm):
    """LayerNorm that applies its weight and forgets its bias (the fused add's residual is right)."""

    def forward(self, x, residual=None):
        out = super().forward(x, residual)
        if self.bias is None:
            return out
        if isinstance(out, tuple):
            return out[0] - self.bias.to(out[0].dtype), out[1]
        return out - self.bias.to(out.dtype)


class PoolerSkipsNormalize(Pooler):
    """The pooling right, the embedding head's L2 normalisation skipped."""

    def __init__(self, pooling_type="MEAN", normalize=True):
        super().__init__(pooling_type, normalize=False)


class PositionsOffByOne(BertEmbedding):
    """Position ids one past where they belong (a RoBERTa-style offset applied to BERT's table)."""

    def forward(self, input_ids, positions, token_type_ids=None):
        return super().forward(input_ids, positions + 1, token_type_ids)


ENCODER_MUTANTS = {
    "encoder-attention-across-sequences": Mutant({EncoderOnlyAttention: EncoderAttentionAcrossSequences}),
    "encoder-attention-scale-1-over-d": Mutant({EncoderOnlyAttention: EncoderAttentionScaleOneOverD}),
    "layer-norm-drops-bias": Mutant({LayerNorm: LayerNormDropsBias}),
    "pooler-skips-normalize": Mutant({Pooler: PoolerSkipsNormalize}),
    "positions-off-by-one": Mutant({BertEmbedding: PositionsOffByOne}, kind=GRADED),
    "encoder-attention-drops-last-key": Mutant({EncoderOnlyAttention: EncoderAttentionDropsLastKey}, kind=GRADED),
}


# ---- the vision tower's ------------------------------------------------------------------------------
class MultiHeadAttentionScaleOneOverD(MultiHeadAttention):
    """The padded-batch attention with the softmax scale 1/head_size."""

    def __init__(self, num_heads, head_size, scale, num_kv_heads=None):
        super().__init__(num_heads, head_size, 1.0 / head_size, num_kv_heads)


class LayerScaleIgnoresGain(LayerScale):
    """The branch added to the residual without its learned per-channel gain."""

    def forward(self, branch, residual):
        return residual + branch


class PositionTableNotResampled(Dinov2PositionEmbedding):
    """The native table's first rows used as they are for a smaller grid (no bicubic resampling)."""

    def position_table(self, grid_height, grid_width, dtype, by_matrix=False):
        return self.position_embeddings.to(dtype)[:, :1 + grid_height * grid_width]

    def forward_triton(self, embeddings, grid_height, grid_width):
        # The one-launch kernel resamples inside; the torch sequence reads the table above.
        return self.forward_fast(embeddings, grid_height, grid_width)


class PatchesColumnMajor(PatchEmbed):
    """Patch tokens flattened column by column where the grid is read row by row."""

    def forward(self, x):
        out = super().forward(x)
        b, n, d = out.shape
        gh, gw = x.shape[-2] // self.patch_size[0], x.shape[-1] // self.patch_size[1]
        return out.reshape(b, gh, gw, d).transpose(1, 2).reshape(b, n, d)


VISION_MUTANTS = {
    "multi-head-attention-scale-1-over-d": Mutant({MultiHeadAttention: MultiHeadAttentionScaleOneOverD}),
    "layer-norm-drops-bias": ENCODER_MUTANTS["layer-norm-drops-bias"],
    # DINOv2's class-token norms vary less than MiniLM's mean-pooled ones: skipping the L2
    # normalisation reorders 42% of the photos' neighbours, a graded bug here, not a gross one.
    "pooler-skips-normalize": Mutant({Pooler: PoolerSkipsNormalize}, kind=GRADED),
    "layer-scale-ignores-gain": Mutant({LayerScale: LayerScaleIgnoresGain}),
    "position-table-not-resampled": Mutant({Dinov2PositionEmbedding: PositionTableNotResampled}),
    "patches-column-major": Mutant({PatchEmbed: PatchesColumnMajor}),
}
