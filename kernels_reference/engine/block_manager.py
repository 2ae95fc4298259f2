"""Hands out fixed-size KV-cache blocks to sequences and takes them back; for models with state
layers (Mamba-2, Qwen3-Next's gated DeltaNet) also one recurrent-state slot per sequence, taken and
given back with its blocks, since both live exactly as long as the sequence's cached tokens."""
from typing import List

from .sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, num_state_slots: int = 0):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free_blocks: List[int] = list(range(num_blocks))
        # 0: the model keeps no per-sequence state, sequences get no slot.
        self.num_state_slots = num_state_slots
        self.free_slots: List[int] = list(range(num_state_slots - 1, -1, -1))  # pop() gives 0 first

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """Extra blocks ``seq`` needs to hold ``num_tokens`` more tokens."""
        total = -(-(seq.num_cached + num_tokens) // self.block_size)
        return max(0, total - len(seq.block_table))

    def _needs_slot(self, seq: Sequence) -> bool:
        return self.num_state_slots > 0 and seq.state_slot is None

    def can_grow(self, seq: Sequence, num_tokens: int) -> bool:
        if self._needs_slot(seq) and not self.free_slots:
            return False
        return self.blocks_needed(seq, num_tokens) <= len(self.free_blocks)

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        need = self.blocks_needed(seq, num_tokens)
        if need > len(self.free_blocks):
            raise RuntimeError(f"out of KV-cache blocks: need {need}, {len(self.free_blocks)} free")
        if self._needs_slot(seq):  # admitted (or readmitted after preemption): its state starts here
            if not self.free_slots:
                raise RuntimeError(f"out of state slots: all {self.num_state_slots} held")
            seq.state_slot = self.free_slots.pop()
        seq.block_table += [self.free_blocks.pop() for _ in range(need)]

    def free(self, seq: Sequence) -> None:
        self.free_blocks += reversed(seq.block_table)
        seq.block_table = []
        seq.num_cached = 0
        # The state is lost with the cached tokens (a preempted sequence is recomputed from its
        # tokens, fresh: has_initial_state is false on its first chunk), so the slot goes back too.
        if seq.state_slot is not None:
            self.free_slots.append(seq.state_slot)
            seq.state_slot = None
