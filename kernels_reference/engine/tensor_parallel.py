"""The engine at tensor-parallel degree > 1: one process per rank, the scheduler on rank 0.

As in vLLM, rank 0 owns the requests, the scheduler, the block manager and the sampler; every rank
holds its shard of the model (built inside :func:`kernels_reference.parallel_state.tensor_parallel`,
so each layer allocates its own part and loads its cut of the full checkpoint) and its own KV cache
(its KV heads only). Before each step rank 0 sends the step's batch (per sequence: the tokens the
step needs, what is cached, the block table, the state slot) to the other ranks; every rank then
runs the same forward, whose sharded layers meet in their all-reduces and all-gathers, so the
logits (all-gathered by ``ParallelLMHead``) are the same on every rank and rank 0 alone samples.

This module does not start processes: :func:`serve_rank` is what each rank runs once a launcher
(``fk_pytest.tp_ranks`` on the CPU, one process per GPU with NCCL) has joined them in a
``torch.distributed`` group::

    def job(rank, world, payload):                  # on every rank
        return serve_rank(rank, world, None, make_model, engine_args, lambda llm: llm.generate(prompts))

``serve_rank`` returns the work's result on rank 0 and None on the others.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

import torch

from ..parallel_state import tensor_parallel
from .llm import LLM
from .sequence import Sequence

_STOP = "stop"


def _describe(batch: List[Tuple[Sequence, int]]) -> List[tuple]:
    """What the other ranks need of each scheduled sequence to run the step (the runner reads the
    tokens up to the step's end, what is cached, the block table and the state slot)."""
    return [(seq.seq_id, list(seq.token_ids[: seq.num_cached + n]), seq.prompt_len, seq.num_cached,
             list(seq.block_table), seq.state_slot, n) for seq, n in batch]


def _rebuild(described: List[tuple]) -> List[Tuple[Sequence, int]]:
    return [(Sequence(seq_id, tokens, prompt_len, 0, num_cached=cached, block_table=table, state_slot=slot), n)
            for seq_id, tokens, prompt_len, cached, table, slot, n in described]


def _broadcast(message: Optional[list], group) -> list:
    import torch.distributed as dist
    box = [message]
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    return box[0]


class BroadcastingRunner:
    """Rank 0's runner: each step's batch goes to the other ranks, then rank 0 runs it too."""

    def __init__(self, runner, group):
        self.runner, self.group = runner, group

    def run(self, batch):
        _broadcast(["run", _describe(batch)], self.group)
        return self.runner.run(batch)

    def predict_tokens(self, batch, first_positions):
        _broadcast(["predict", _describe(batch), list(first_positions)], self.group)
        return self.runner.predict_tokens(batch, first_positions)

    def stop(self) -> None:
        _broadcast([_STOP], self.group)

    def __getattr__(self, name):  # steps, device, max_model_len, ...: the wrapped runner's
        return getattr(self.runner, name)


def follow(runner, group) -> int:
    """A rank other than 0: run every step rank 0 sends until it says stop; returns the step count."""
    steps = 0
    while True:
        message = _broadcast(None, group)
        if message[0] == _STOP:
            return steps
        steps += 1
        if message[0] == "run":
            runner.run(_rebuild(message[1]))
        elif message[0] == "predict":
            runner.predict_tokens(_rebuild(message[1]), message[2])
        else:
            raise RuntimeError(f"unknown engine step message {message[0]!r} from rank 0")


def serve_rank(rank: int, world_size: int, group, make_model: Callable[[], torch.nn.Module], engine_args: dict,
               work: Callable[[LLM], Any]) -> Any:
    """Build this rank's shard of the model (``make_model`` runs inside the rank's tensor-parallel
    state) and its engine; rank 0 runs ``work(llm)`` (generate, score, ...) while the others follow
    its steps. Returns ``work``'s result on rank 0, and on the other ranks the number of steps they
    ran. If rank 0's work raises, the others are told to stop first."""
    with tensor_parallel(world_size, rank, group):
        llm = LLM(make_model(), **engine_args)
        if rank != 0:
            return follow(llm.runner, group)
        llm.runner = BroadcastingRunner(llm.runner, group)
        try:
            return work(llm)
        finally:
            llm.runner.stop()
