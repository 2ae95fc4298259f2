"""Runs one scheduled step through the model: packs the tokens, builds the attention metadata
(context = tokens already cached), and returns the logits of each sequence's last token.

Pure-decode steps (one token per sequence) go through :class:`PaddedDecoder` when it is on: static
buffers padded to a bucket size, replayed from CUDA graphs (``cuda_graphs``) or run eagerly
(``padded_decode``, which is how the CPU tests check the padding). Every other step runs eagerly.
``compile`` puts the model body under ``torch.compile``; the graphs then capture the compiled code.
"""
import collections
from typing import List, Optional, Sequence as Seq, Tuple, Union

import torch

from ..forward_context import AttentionMetadata, plan_step, set_forward_context, step_planners
from .decode_graphs import PaddedDecoder, graph_batch_sizes
from .fused_decode import FusedDecode, FusedDecodeConfig
from .sequence import Sequence


class ModelRunner:
    def __init__(self, model, num_blocks: int, block_size: int, max_num_seqs: int = 64,
                 max_model_len: Optional[int] = None, cuda_graphs: bool = False,
                 padded_decode: Optional[bool] = None, compile: Union[bool, dict] = False,
                 graph_sizes: Optional[Seq[int]] = None, fused_decode: Union[bool, FusedDecodeConfig] = False):
        self.model, self.block_size = model, block_size
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        if cuda_graphs and padded_decode is False:
            raise ValueError("cuda_graphs=True replays the padded decode path: padded_decode=False contradicts it")
        if not isinstance(fused_decode, (bool, FusedDecodeConfig)):
            raise ValueError(f"fused_decode must be a bool or a FusedDecodeConfig, got {fused_decode!r}")
        if fused_decode and not padded_decode and not cuda_graphs:
            raise ValueError("fused_decode=True runs in the padded decode path: it needs cuda_graphs or padded_decode")
        if cuda_graphs and self.device.type != "cuda":
            raise ValueError(f"cuda_graphs=True needs a CUDA model (this one is on {self.device}); "
                             "padded_decode=True runs the same padded path eagerly")
        limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        self.max_model_len = max_model_len or min(num_blocks * block_size, limit or num_blocks * block_size)
        self.cuda_graphs = cuda_graphs
        # Steps run per path ("decode-graph", "decode-padded", "decode-eager", "mixed", "prefill",
        # "teacher-forced"): what a score says it came from.
        self.steps: collections.Counter = collections.Counter()
        padded = cuda_graphs if padded_decode is None else padded_decode
        # Padding rows carry cache slot -1. The fast attention path skips it; a plain PyTorch store
        # writes it to the cache's last slot, so that slot belongs to a block no sequence is given.
        # Models without attention layers (Mamba-2) have no KV cache to allocate.
        if hasattr(model, "allocate_kv_cache"):
            model.allocate_kv_cache(num_blocks + 1 if padded else num_blocks, block_size)
        # Models with state layers: one slot per running sequence (the block manager hands them
        # out), plus a spare one that the padded decode path's padding rows write into.
        self.has_states = hasattr(model, "allocate_state_pools")
        self.spare_slot = max_num_seqs if self.has_states else None
        pools = model.allocate_state_pools(max_num_seqs + 1) if self.has_states else []
        self.forward = _compiled(model.forward, compile) if compile else model.forward
        # Modules that plan each step on the host (``plan_step``, e.g. a FlashInfer candidate).
        self.planners = step_planners(model)
        self.decoder = None
        if padded:
            sizes = list(graph_sizes) if graph_sizes else graph_batch_sizes(max_num_seqs)
            # fused_decode: the batch-1 bucket runs the fused Llama step (fused_decode.py says where
            # it applies); refused with the reason when the model is not made of the reference modules.
            config = fused_decode if isinstance(fused_decode, FusedDecodeConfig) else None
            decode_forward = FusedDecode(model, self.forward, config) if fused_decode else self.forward
            self.decoder = PaddedDecoder(decode_forward, model.compute_logits, sizes, block_size,
                                         -(-self.max_model_len // block_size), model.config.vocab_size, self.device,
                                         spare_slot=self.spare_slot,
                                         state_pools=[t for pair in pools for t in pair], planners=self.planners)
            if cuda_graphs:
                self.decoder.capture()

    @torch.no_grad()
    def run(self, batch: List[Tuple[Sequence, int]]) -> torch.Tensor:
        """Float32 logits [len(batch), vocab] of each sequence's last token this step. From the
        graphs the tensor is a view of a static buffer: valid until the next step."""
        if self.decoder is not None and all(n == 1 for _, n in batch) and self.decoder.bucket(len(batch)):
            logits = self.decoder.run(batch, graphs=self.cuda_graphs)
            for seq, _ in batch:
                seq.num_cached += 1
            self.steps["decode-graph" if self.cuda_graphs else "decode-padded"] += 1
            return logits
        decoding = [seq.decodes(n) for seq, n in batch]
        self.steps["decode-eager" if all(decoding) else "mixed" if any(decoding) else "prefill"] += 1
        hidden, lens = self._forward_packed(batch)
        last = torch.tensor(lens, device=self.device).cumsum(0) - 1
        return self.model.compute_logits(hidden[last]).float()

    @torch.no_grad()
    def predict_tokens(self, batch: List[Tuple[Sequence, int]], first_positions: Seq[int]) -> List[List[int]]:
        """Greedy top-1 next token at every position of each sequence's chunk that is at or after
        its ``first_positions`` entry (teacher forcing: the inputs are the given tokens)."""
        starts = [seq.num_cached for seq, _ in batch]
        self.steps["teacher-forced"] += 1
        hidden, lens = self._forward_packed(batch)
        rows, counts, offset = [], [], 0
        for start, n, first in zip(starts, lens, first_positions):
            skip = min(n, max(0, first - start))
            rows += range(offset + skip, offset + n)
            counts.append(n - skip)
            offset += n
        if not rows:
            return [[] for _ in batch]
        tokens = self.model.compute_logits(hidden[torch.tensor(rows, device=self.device)]).argmax(-1).tolist()
        out, at = [], 0
        for c in counts:
            out.append(tokens[at: at + c])
            at += c
        return out

    def _forward_packed(self, batch):
        """Eager step: hidden states [total tokens, hidden] of the packed batch; advances the caches."""
        ids, ctx, lens = [], [], []
        for seq, n in batch:
            ids += seq.token_ids[seq.num_cached: seq.num_cached + n]
            ctx.append(seq.num_cached)
            lens.append(n)
        slots = [seq.state_slot for seq, _ in batch] if self.has_states else None
        if slots is not None and None in slots:
            raise RuntimeError("a sequence of a model with state layers reached the runner without a state slot "
                               "(the block manager was built with num_state_slots=0)")
        meta = AttentionMetadata.build(ctx, lens, self.block_size, device=self.device,
                                       block_tables=[seq.block_table for seq, _ in batch], state_slots=slots)
        plan_step(self.planners, meta)
        with set_forward_context(meta):
            hidden = self.forward(torch.tensor(ids, device=self.device), meta.positions())
        for seq, n in batch:
            seq.num_cached += n
        return hidden, lens


def _compiled(forward, options: Union[bool, dict]):
    """``torch.compile`` of the model body. Dynamic token count by default: one graph serves every
    prefill size and decode bucket (size 1 still gets its own specialisation, the latency case
    that matters most). A dict passes options through (e.g. ``{"backend": "aot_eager"}``)."""
    kwargs = {"dynamic": True, **(options if isinstance(options, dict) else {})}
    return torch.compile(forward, **kwargs)
