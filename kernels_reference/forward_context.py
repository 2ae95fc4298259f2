"""Per-step attention metadata, passed the way production passes it: a forward context.

vLLM sets a forward context around each model step; attention layers read their metadata from it
instead of taking it as arguments through every module. A batch mixes sequences that prefill (many
query tokens, possibly a later chunk of a long prompt) and sequences that decode (one query token);
each sequence's keys/values live in a paged cache addressed through its block table.

Linear-attention and state-space layers (Mamba-2, Qwen3-Next's gated DeltaNet) keep a fixed-size
state per sequence instead: a conv window and a recurrent state, each in a pool of slots that the
layer binds (``state_cache``) as attention layers bind their KV cache. ``state_slots`` names each
sequence's slot; a sequence with context already cached continues its state
(``has_initial_state``), one without starts from zero.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

import torch


@dataclasses.dataclass
class AttentionMetadata:
    query_start_loc: torch.Tensor  # [B + 1] int32: cu_seqlens of the packed query tokens
    seq_lens: torch.Tensor  # [B] int32: tokens in the cache after this step (context + query)
    block_tables: torch.Tensor  # [B, max_blocks] int32: physical block of each logical block
    slot_mapping: torch.Tensor  # [T] int64: cache slot (block * block_size + offset) of each token
    block_size: int
    max_query_len: int
    max_seq_len: int
    # Host copies of the per-sequence lengths (vLLM keeps ``seq_lens_cpu`` for the same reason):
    # code that plans work per sequence reads these instead of syncing with the device, which also
    # keeps it legal inside CUDA-graph capture and on the meta device.
    query_lens_cpu: Tuple[int, ...] = ()
    seq_lens_cpu: Tuple[int, ...] = ()
    state_slots: Optional[torch.Tensor] = None  # [B] int32: each sequence's slot in the state pools
    # Leading sequences that state layers run as decodes; None: planned from the host lengths. The
    # padded decode path sets it to the whole padded batch, so its plan (and a CUDA graph captured
    # from it) does not depend on how many rows are padding (padding rows decode into a spare slot).
    num_decodes: Optional[int] = None

    @property
    def has_initial_state(self) -> torch.Tensor:
        """[B] bool: the sequence has tokens cached before this step (its state continues)."""
        query_lens = self.query_start_loc[1:] - self.query_start_loc[:-1]
        return self.seq_lens > query_lens

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.numel()

    @staticmethod
    def build(context_lens: Sequence[int], query_lens: Sequence[int], block_size: int,
              device="cpu", block_tables: Optional[List[List[int]]] = None,
              state_slots: Optional[Sequence[int]] = None) -> "AttentionMetadata":
        """Metadata for sequences with ``context_lens`` tokens already cached and ``query_lens`` new.

        Without ``block_tables`` each sequence gets consecutive blocks after the previous one's
        (enough for its final length); pass tables from a block manager to place them elsewhere.
        ``state_slots``: each sequence's slot in the recurrent-state pools (default: none).
        """
        seq_lens = [c + q for c, q in zip(context_lens, query_lens)]
        if block_tables is None:
            block_tables, next_block = [], 0
            for n in seq_lens:
                count = -(-n // block_size)
                block_tables.append(list(range(next_block, next_block + count)))
                next_block += count
        width = max(len(t) for t in block_tables) if block_tables else 0
        tables = torch.tensor([t + [0] * (width - len(t)) for t in block_tables], dtype=torch.int32)
        slots = []
        for table, ctx, n in zip(block_tables, context_lens, seq_lens):
            slots += [table[p // block_size] * block_size + p % block_size for p in range(ctx, n)]
        starts = [0]
        for q in query_lens:
            starts.append(starts[-1] + q)
        return AttentionMetadata(
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
            block_tables=tables.to(device), slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
            block_size=block_size, max_query_len=max(query_lens, default=0), max_seq_len=max(seq_lens, default=0),
            query_lens_cpu=tuple(query_lens), seq_lens_cpu=tuple(seq_lens),
            state_slots=None if state_slots is None else torch.tensor(list(state_slots), dtype=torch.int32,
                                                                        device=device))

    def positions(self) -> torch.Tensor:
        """Absolute position of each query token (its index in its sequence)."""
        out = [torch.arange(n - q, n) for q, n in zip(self.query_lens_cpu, self.seq_lens_cpu)]
        return torch.cat(out).to(self.seq_lens.device) if out else torch.zeros(0, dtype=torch.long)


def page_table(meta: AttentionMetadata) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The step's cache as a CSR page table, the form paged-attention libraries (FlashInfer) plan
    from: (indptr [B + 1], indices, last_page_len [B]), int32. Each sequence's used pages (its block
    table's first ceil(len / block_size) entries, in order) back to back in ``indices``, gathered on
    the metadata's device from host-built positions (no device sync); ``indptr`` and the slots used
    in each last page on the host, from the host lengths. A sequence with no tokens (a padding row
    of a decode batch) has no page and a last-page length of 0."""
    block = meta.block_size
    pages = [-(-n // block) for n in meta.seq_lens_cpu]
    counts = torch.tensor(pages, dtype=torch.long)
    indptr = torch.zeros(len(pages) + 1, dtype=torch.int32)
    indptr[1:] = counts.cumsum(0)
    last = torch.tensor([n - (p - 1) * block if p else 0 for n, p in zip(meta.seq_lens_cpu, pages)],
                        dtype=torch.int32)
    rows = torch.repeat_interleave(torch.arange(len(pages)), counts)
    columns = torch.arange(rows.numel()) - torch.repeat_interleave(indptr[:-1].long(), counts)
    device = meta.block_tables.device
    indices = meta.block_tables[rows.to(device), columns.to(device)].to(torch.int32)
    return indptr, indices, last


@dataclasses.dataclass
class StatePhase:
    """One phase of a step of a state-carrying layer: its tokens, query_start_loc rebased to its
    first token, each sequence's state slot, which sequences continue a state (None for decode:
    all do; ``any_continues`` says whether any does), and whether it is the decode phase."""
    tokens: slice
    query_start_loc: torch.Tensor
    slots: torch.Tensor
    continues: Optional[torch.Tensor]
    any_continues: bool
    decode: bool


def step_states(layer) -> Tuple[AttentionMetadata, torch.Tensor, ...]:
    """(the step's metadata, conv_states, ssm_states) of a state-carrying layer ((metadata,
    recurrent_states) of one without a conv window, GLA's; (metadata, shift_states,
    recurrent_states) of RWKV-7's, whose first pool holds each sequence's last hidden row), or an
    error naming what the caller did not set up."""
    meta = get_forward_context()
    if meta is None or getattr(layer, "state_cache", None) is None:
        raise RuntimeError(f"{type(layer).__name__} needs the step's metadata (set_forward_context) "
                           "and its bound state_cache = (conv_states, ssm_states), or (recurrent_states,)")
    return (meta, *layer.state_cache)


def state_phases(meta: AttentionMetadata, tokens: int) -> List[StatePhase]:
    """The step's sequences as the leading one-token continuing sequences (decode, vLLM's order),
    then the rest (prefill: fresh and continued prompts, chunks of long ones). Planned from the
    metadata's host copies of the lengths, so no device sync is needed (and the meta device works).
    Without ``state_slots`` sequence i uses slot i."""
    query_lens: List[int] = list(meta.query_lens_cpu) or meta.query_start_loc.diff().tolist()
    seq_lens: List[int] = list(meta.seq_lens_cpu) or meta.seq_lens.tolist()
    n = len(query_lens)
    decodes = 0
    if meta.num_decodes is not None:
        decodes = meta.num_decodes
    else:
        while decodes < n and query_lens[decodes] == 1 and seq_lens[decodes] > 1:
            decodes += 1
    slots = meta.state_slots
    if slots is None:
        slots = torch.arange(n, dtype=torch.int32, device=meta.query_start_loc.device)
    qsl = meta.query_start_loc
    phases = []
    if decodes:
        phases.append(StatePhase(slice(0, decodes), qsl[: decodes + 1], slots[:decodes], None, True, True))
    if decodes < n:
        continuing = any(s > q for s, q in zip(seq_lens[decodes:], query_lens[decodes:]))
        phases.append(StatePhase(slice(decodes, tokens), qsl[decodes:] - decodes, slots[decodes:],
                                 meta.has_initial_state[decodes:], continuing, False))
    return phases


# ---- per-step planning ------------------------------------------------------------------------------
# Kernel libraries such as FlashInfer split attention into a host-side ``plan`` (work partition,
# page-table indices, written into buffers the kernel reads) done once per step, and a ``run`` per
# layer; vLLM's FlashInfer backend plans in its metadata builder, before the step's forward and
# outside any CUDA graph. A module takes part by defining ``plan_step(metadata)``: the engine calls it
# once per step before the forward (eager steps, each padded decode step, before a decode bucket is
# captured and again before each replay of it, with that step's metadata), and kernel-level tasks
# call it before each call outside graph capture. A plan read by a captured graph must live in
# buffers whose addresses stay fixed: the replay reads them where capture found them.

def step_planners(model) -> List[Callable[[AttentionMetadata], None]]:
    """The ``plan_step`` methods of ``model``'s modules (none for the reference's modules)."""
    modules = model.modules() if hasattr(model, "modules") else [model]
    return [m.plan_step for m in modules if callable(getattr(m, "plan_step", None))]


def plan_step(planners: Sequence[Callable[[AttentionMetadata], None]], metadata: AttentionMetadata) -> None:
    """Each planner on the step's metadata; a failure names the module whose plan raised."""
    for planner in planners:
        try:
            planner(metadata)
        except Exception as e:
            owner = type(getattr(planner, "__self__", planner)).__name__
            raise RuntimeError(f"{owner}.plan_step failed on the step's metadata "
                               f"({metadata.num_seqs} sequences, {len(metadata.slot_mapping)} tokens): "
                               f"{type(e).__name__}: {e}") from e


_CONTEXT: List[AttentionMetadata] = []


@contextlib.contextmanager
def set_forward_context(metadata: Optional[AttentionMetadata]) -> Iterator[None]:
    _CONTEXT.append(metadata)
    try:
        yield
    finally:
        _CONTEXT.pop()


def get_forward_context() -> Optional[AttentionMetadata]:
    return _CONTEXT[-1] if _CONTEXT else None
