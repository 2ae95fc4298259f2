"""Runs one scheduled step through the model: packs the tokens, builds the attention metadata
(context = tokens already cached), and returns the logits of each sequence's last token."""
from typing import List, Tuple

import torch

from ..forward_context import AttentionMetadata, set_forward_context
from .sequence import Sequence


class ModelRunner:
    def __init__(self, model, num_blocks: int, block_size: int):
        self.model, self.block_size = model, block_size
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        model.allocate_kv_cache(num_blocks, block_size)

    @torch.no_grad()
    def run(self, batch: List[Tuple[Sequence, int]]) -> torch.Tensor:
        ids, ctx, lens = [], [], []
        for seq, n in batch:
            ids += seq.token_ids[seq.num_cached: seq.num_cached + n]
            ctx.append(seq.num_cached)
            lens.append(n)
        meta = AttentionMetadata.build(ctx, lens, self.block_size, device=self.device,
                                       block_tables=[seq.block_table for seq, _ in batch])
        with set_forward_context(meta):
            hidden = self.model(torch.tensor(ids, device=self.device), meta.positions())
        last = torch.tensor(lens, device=self.device).cumsum(0) - 1
        for seq, n in batch:
            seq.num_cached += n
        return self.model.compute_logits(hidden[last]).float()
