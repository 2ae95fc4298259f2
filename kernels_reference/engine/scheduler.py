"""Continuous batching with chunked prefill (vLLM's V1 policy, simplified).

Each step has a token budget. Running sequences decode first (one token each); the remaining
budget goes to waiting prompts in arrival order, a prompt that does not fit whole being split into
chunks when chunked prefill is on. When the cache runs out of blocks, the most recently admitted
running sequence is preempted: its blocks are freed and it is recomputed later.
"""
from collections import deque
from typing import Deque, List, Tuple

from .block_manager import BlockManager
from .sequence import Sequence, Status


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int = 64,
                 max_num_batched_tokens: int = 2048, chunked_prefill: bool = True):
        self.blocks = block_manager
        self.max_num_seqs, self.budget = max_num_seqs, max_num_batched_tokens
        self.chunked_prefill = chunked_prefill
        self.waiting: Deque[Sequence] = deque()
        self.running: List[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> List[Tuple[Sequence, int]]:
        """(sequence, number of its tokens to run this step), decodes first."""
        batch, budget = [], self.budget
        for seq in list(self.running):
            if seq.status is not Status.RUNNING:  # preempted earlier in this loop
                continue
            n = min(seq.num_pending, budget) if self.chunked_prefill else seq.num_pending
            if n == 0 or n > budget:
                continue
            while not self.blocks.can_grow(seq, n) and self.running[-1] is not seq:
                self._preempt(self.running[-1])
            if not self.blocks.can_grow(seq, n):
                self._preempt(seq)
                continue
            self.blocks.grow(seq, n)
            batch.append((seq, n))
            budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            n = seq.num_pending
            if n > budget:
                if not self.chunked_prefill:
                    break
                n = budget
            if not self.blocks.can_grow(seq, n):
                break
            self.waiting.popleft()
            self.blocks.grow(seq, n)
            seq.status = Status.RUNNING
            self.running.append(seq)
            batch.append((seq, n))
            budget -= n
        # Decodes first: a running sequence still in its prompt's chunks may precede one that
        # decodes. State layers plan a step as its leading one-token continuing sequences (the
        # decode kernels) then the rest; a decode left behind a chunk would run through the prefill
        # scan (correct, but the slower path). Stable, so arrival order holds within each kind.
        batch.sort(key=lambda item: not item[0].decodes(item[1]))
        if not batch and self.waiting and not self.running:
            raise RuntimeError("a waiting prompt can never be scheduled: raise max_num_batched_tokens "
                               "or the number of KV-cache blocks, or enable chunked prefill")
        return batch

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.free(seq)
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.free(seq)
        seq.status = Status.FINISHED
