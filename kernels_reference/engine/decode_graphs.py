"""Pure-decode steps on static buffers, padded to a bucket size, replayed from CUDA graphs.

A decode step runs one token per sequence, so its work is fixed by the number of sequences. At
start-up the model forward (and the logits) is captured once per bucket size; a step pads its
batch to the next bucket, writes its values into the static buffers the graphs read, and replays.
Padding rows are inert: token 0 at position 0, cache slot -1 (not stored) and length 0 (nothing
attended). For a model with state layers (``spare_slot`` given) each row also names its sequence's
state slot, and padding rows name the spare slot, which no sequence holds: the state layers run
every row as a decode (``num_decodes``), so the plan is the same for any number of padding rows and
the padding's state updates land where nothing reads them. Mixed and prefill steps never come
here; they run eagerly.

The same static-buffer path runs without graphs (``PaddedDecoder.run`` with ``graphs=False``):
on the CPU that is how tests check the padding, and on CUDA it runs the very kernels (the same
padded shapes) that the graphs replay, so greedy tokens agree exactly.

The host side is kept lean because at batch 1 the GPU step is only a few milliseconds: per step the
values are written into pinned host staging buffers through numpy views (no per-element torch
calls), moved with three asynchronous copies, and one graph is replayed.
"""
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ..cuda_graphs import capture
from ..forward_context import AttentionMetadata, plan_step, set_forward_context


def graph_batch_sizes(max_num_seqs: int) -> List[int]:
    """Bucket sizes as vLLM/nano-vllm choose them: 1, 2, 4, 8, then every 16, and the maximum."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    sizes = [s for s in (1, 2, 4, 8) if s < max_num_seqs] + list(range(16, max_num_seqs, 16))
    return sizes + [max_num_seqs]


def bucket_for(num_seqs: int, sizes: Sequence[int]) -> Optional[int]:
    """Smallest bucket that holds ``num_seqs`` sequences; None when none does (run eagerly)."""
    return next((s for s in sorted(sizes) if s >= num_seqs), None)


# Eager runs of a step whose replay missed the bar, to measure how far the step differs from itself.
EAGER_REPEATS = 2


def _relative(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x - ref).norm() / ref.norm().clamp_min(1e-30))


class PaddedDecoder:
    """Static decode buffers for up to ``max(sizes)`` sequences, and one CUDA graph per size.

    ``forward(input_ids, positions) -> hidden`` and ``logits(hidden) -> logits`` are the model's
    (possibly compiled) body and head. ``max_blocks`` = the block-table width every graph is
    captured with (ceil(max_model_len / block_size)): attention launches may depend on it.
    ``spare_slot``: for a model with state layers, the state-pool slot padding rows use;
    ``state_pools``: those layers' pools (tensors indexed by slot), which the first replay of each
    bucket puts back before it re-runs the step eagerly to check it (a decode step advances a
    state, so running it twice on the same pools is not a repeat of it). ``planners``: the model's
    ``plan_step`` methods (:func:`kernels_reference.forward_context.step_planners`), run on every
    step's metadata before its forward or replay, and before each bucket's capture.
    """

    def __init__(self, forward: Callable, logits: Callable, sizes: Sequence[int], block_size: int,
                 max_blocks: int, vocab_size: int, device: torch.device, spare_slot: Optional[int] = None,
                 state_pools: Sequence[torch.Tensor] = (), planners: Sequence[Callable] = ()):
        if not sizes or min(sizes) < 1:
            raise ValueError(f"decode bucket sizes must be positive, got {list(sizes)}")
        self.forward, self.logits = forward, logits
        self.planners = list(planners)
        self.sizes = sorted(set(sizes))
        self.block_size, self.max_blocks = block_size, max_blocks
        self.device = torch.device(device)
        n = self.sizes[-1]
        on_cuda = self.device.type == "cuda"
        # Device buffers the graphs read. Rows 0..2 of ``tokens``: input id, position, cache slot.
        self.tokens = torch.zeros(3, n, dtype=torch.int64, device=device)
        self.seq_lens = torch.zeros(n, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(n, max_blocks, dtype=torch.int32, device=device)
        # One query token per row, padding included: the start offsets never change.
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.out_logits = torch.zeros(n, vocab_size, dtype=torch.float32, device=device)
        self.spare_slot = spare_slot
        self.state_pools = list(state_pools)
        self.state_slots = None if spare_slot is None else \
            torch.full((n,), spare_slot, dtype=torch.int32, device=device)
        self._slots_host = self.state_slots
        if on_cuda and spare_slot is not None:
            self._slots_host = torch.full((n,), spare_slot, dtype=torch.int32, pin_memory=True)
        self._slots_np = None if spare_slot is None else self._slots_host.numpy()
        if on_cuda:  # pinned staging, so the copies are asynchronous DMA
            self._tokens_host = torch.zeros(3, n, dtype=torch.int64, pin_memory=True)
            self._seq_lens_host = torch.zeros(n, dtype=torch.int32, pin_memory=True)
            self._tables_host = torch.zeros(n, max_blocks, dtype=torch.int32, pin_memory=True)
        else:  # on the CPU the device buffers are the host buffers: nothing to copy
            self._tokens_host, self._seq_lens_host, self._tables_host = self.tokens, self.seq_lens, self.block_tables
        self._tokens_np = self._tokens_host.numpy()
        self._seq_lens_np = self._seq_lens_host.numpy()
        self._tables_np = self._tables_host.numpy()
        # Recorded after each step's copies: staging is rewritten only once they are done.
        self._copied = torch.cuda.Event() if on_cuda else None
        self.graphs: Dict[int, "torch.cuda.CUDAGraph"] = {}
        self._checked = set()  # buckets whose replay matched an eager run
        self._pool = None

    # ---- per step ---------------------------------------------------------------------------
    def bucket(self, num_seqs: int) -> Optional[int]:
        return bucket_for(num_seqs, self.sizes)

    def run(self, batch: List[Tuple[object, int]], graphs: bool) -> torch.Tensor:
        """Logits [len(batch), vocab] float32 of a batch whose sequences each run one token.

        With graphs the result is a view of a static buffer, valid until the next step.
        """
        n = len(batch)
        size = self.bucket(n)
        if size is None:
            raise ValueError(f"{n} sequences exceed the largest decode bucket {self.sizes[-1]}")
        seq_lens = self._stage(batch, size)
        if not graphs:
            return self._run_eager(size, seq_lens)[:n]
        first = size not in self._checked
        before = self._state_rows(size) if first else None
        if self.planners:  # the plan's buffers are where the graph reads them
            plan_step(self.planners, self._metadata(size, seq_lens))
        self.graphs[size].replay()
        if first:
            self._check_replay(size, n, seq_lens, before)
        return self.out_logits[:n]

    def _run_eager(self, size: int, seq_lens: Sequence[int]) -> torch.Tensor:
        meta = self._metadata(size, seq_lens)
        plan_step(self.planners, meta)
        with set_forward_context(meta):
            hidden = self.forward(self.tokens[0, :size], self.tokens[1, :size])
            return self.logits(hidden).float()  # the head on all rows: the graphs' GEMM shape

    def _state_rows(self, size: int) -> List[torch.Tensor]:
        """Copies of the step's rows of every state pool (padding rows: the spare slot's)."""
        if not self.state_pools:
            return []
        slots = self.state_slots[:size].long()
        return [pool.index_select(0, slots) for pool in self.state_pools]

    def _check_replay(self, size: int, n: int, seq_lens: Sequence[int], before: List[torch.Tensor]) -> None:
        """First real step of each bucket: the replay must match the same step run eagerly. The KV
        cache is simply rewritten with the same values; the state rows the replay advanced are put
        back first, and after the eager step they must equal the replay's. A graph captured from a
        layer that plans its work from host values, not tensors, would be silently wrong.

        A step that does not repeat bitwise (a reduction by atomic adds, as ``index_add_`` on a GPU)
        can differ from itself by more than the bar where the model amplifies rounding: on an H100
        on 2026-12-07 an honest MoE tree's replay of a random-weight Qwen3-30B-A3B step differed from
        its eager run by 0.0396, one near-tied expert choice. So where the first comparison fails,
        the step runs eagerly ``EAGER_REPEATS`` more times, and the replay is allowed twice the
        largest difference among those eager runs: zero for a step that repeats, which keeps the
        bar; a capture that reads stale lengths or slots is off by O(1) either way."""
        replayed_states = self._state_rows(size)
        slots = self.state_slots[:size].long() if before else None
        replayed = self.out_logits[:n].clone()

        def eager_step():
            for pool, rows in zip(self.state_pools, before):
                pool.index_copy_(0, slots, rows)
            logits = self._run_eager(size, seq_lens)[:n].clone()
            return logits, [pool.index_select(0, slots[:n]).float() for pool in self.state_pools]

        def errors(logits, states, ref_logits, ref_states):
            return _relative(logits, ref_logits), max((_relative(s, r) for s, r in zip(states, ref_states)), default=0.0)

        eager, eager_states = eager_step()
        replayed_states = [r[:n].float() for r in replayed_states]
        err, state_err = errors(replayed, replayed_states, eager, eager_states)
        spread, bar = 0.0, 2e-2  # same kernels: 0; bf16 from other kernels: ~4e-3; stale lengths or slots: O(1)
        if not (err <= bar and state_err <= bar):
            repeats = [eager_step() for _ in range(EAGER_REPEATS)]
            spread = max(max(errors(*r, eager, eager_states)) for r in repeats)
            bar = max(bar, 2 * spread)
        if not (err <= bar and state_err <= bar):
            raise RuntimeError(f"CUDA-graph replay of decode bucket {size} disagrees with the same step run "
                               f"eagerly (relative error of the logits {err:.3g}, of the states {state_err:.3g}; "
                               f"{EAGER_REPEATS} more eager runs of the step differ from the first by up to "
                               f"{spread:.3g}, so {bar:.3g} is allowed): the model's decode path is not capturable "
                               "(attention must read lengths and tables, state layers their slots, from tensors only)")
        self._checked.add(size)

    def _stage(self, batch, size: int) -> List[int]:
        """Write the step's values (and inert padding rows) into the buffers; host lengths back."""
        if self._copied is not None:  # the previous step's copies must have left the staging
            self._copied.synchronize()
        tokens, lens, tables, bs = self._tokens_np, self._seq_lens_np, self._tables_np, self.block_size
        seq_lens = []
        for i, (seq, _) in enumerate(batch):
            pos = seq.num_cached
            table = seq.block_table
            tokens[0, i] = seq.token_ids[pos]
            tokens[1, i] = pos
            tokens[2, i] = table[pos // bs] * bs + pos % bs
            lens[i] = pos + 1
            tables[i, :len(table)] = table  # entries past the table are never read (length bound)
            seq_lens.append(pos + 1)
            if self._slots_np is not None:
                self._slots_np[i] = seq.state_slot
        n = len(batch)
        if n < size:
            tokens[0, n:size] = 0
            tokens[1, n:size] = 0
            tokens[2, n:size] = -1
            lens[n:size] = 0
            seq_lens += [0] * (size - n)
            if self._slots_np is not None:
                self._slots_np[n:size] = self.spare_slot
        if self._tokens_host is not self.tokens:
            self.tokens.copy_(self._tokens_host, non_blocking=True)
            self.seq_lens[:size].copy_(self._seq_lens_host[:size], non_blocking=True)
            self.block_tables[:size].copy_(self._tables_host[:size], non_blocking=True)
            if self.state_slots is not None:
                self.state_slots[:size].copy_(self._slots_host[:size], non_blocking=True)
            self._copied.record()
        return seq_lens

    def _metadata(self, size: int, seq_lens: Sequence[int]) -> AttentionMetadata:
        """Metadata over the static buffers. Captured graphs keep the tensors and ignore the host
        lengths, which only the eager (native) attention path reads."""
        return AttentionMetadata(
            query_start_loc=self.query_start_loc[:size + 1], seq_lens=self.seq_lens[:size],
            block_tables=self.block_tables[:size], slot_mapping=self.tokens[2, :size],
            block_size=self.block_size, max_query_len=1, max_seq_len=self.max_blocks * self.block_size,
            query_lens_cpu=(1,) * size, seq_lens_cpu=tuple(seq_lens),
            state_slots=None if self.state_slots is None else self.state_slots[:size],
            num_decodes=None if self.state_slots is None else size)

    # ---- start-up -----------------------------------------------------------------------------
    @torch.no_grad()
    def capture(self) -> None:
        """One graph per bucket, largest first, all in one memory pool (a smaller graph's
        activations fit in the pool the largest one left)."""
        if self.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA model")
        self._pad_all()
        self._pool = torch.cuda.graph_pool_handle()
        for size in reversed(self.sizes):
            meta = self._metadata(size, (0,) * size)
            plan_step(self.planners, meta)  # outside the graph, as before every replay
            with set_forward_context(meta):
                # Warm-up outside the graph: Triton JIT/autotuning, torch.compile, lazy tables.
                self.out_logits[:size] = self.logits(self.forward(self.tokens[0, :size], self.tokens[1, :size])).float()
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with capture(graph, pool=self._pool):
                    hidden = self.forward(self.tokens[0, :size], self.tokens[1, :size])
                    self.out_logits[:size] = self.logits(hidden).float()
            self.graphs[size] = graph
        torch.cuda.synchronize()

    def _pad_all(self) -> None:
        """Every row inert, as capture and warm-up run on whatever the buffers hold."""
        self.tokens[0].zero_()
        self.tokens[1].zero_()
        self.tokens[2].fill_(-1)
        self.seq_lens.zero_()
        self.block_tables.zero_()
        if self.state_slots is not None:
            self.state_slots.fill_(self.spare_slot)
