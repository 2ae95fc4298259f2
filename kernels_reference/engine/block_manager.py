"""Hands out fixed-size KV-cache blocks to sequences and takes them back."""
from typing import List

from .sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free_blocks: List[int] = list(range(num_blocks))

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """Extra blocks ``seq`` needs to hold ``num_tokens`` more tokens."""
        total = -(-(seq.num_cached + num_tokens) // self.block_size)
        return max(0, total - len(seq.block_table))

    def can_grow(self, seq: Sequence, num_tokens: int) -> bool:
        return self.blocks_needed(seq, num_tokens) <= len(self.free_blocks)

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        need = self.blocks_needed(seq, num_tokens)
        if need > len(self.free_blocks):
            raise RuntimeError(f"out of KV-cache blocks: need {need}, {len(self.free_blocks)} free")
        seq.block_table += [self.free_blocks.pop() for _ in range(need)]

    def free(self, seq: Sequence) -> None:
        self.free_blocks += reversed(seq.block_table)
        seq.block_table = []
        seq.num_cached = 0
