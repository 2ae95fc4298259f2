"""Split-K flash-decoding over a paged KV cache, in Triton (the decode half of ``Attention``).

Decode is bound by reading the KV cache once, so the kernels are organised around that read:

* one program per (sequence, kv head, split): all query heads of a GQA group are loaded as one tile
  and share every K/V block the program reads (K/V are read once per group, not once per head);
* an online softmax in float32 over tiles of several blocks, K and V requested together.

Three kernels, chosen by ``DecodeConfig.kernel`` (the third, ``"blocks"``, reads whole cache blocks
for every head; it lives in paged_decode_blocks.py, selectable as ``BLOCKS_CONFIG``: on the H200 it
is level with the two-pass kernel at B1 C8192 and faster at other batch-1 lengths, see there):

* ``"one-pass"`` (selectable, not the default). Split s takes tiles s, s+S, s+2S, ... of its sequence (balanced to one
  tile whatever the length); every split with work writes a partial and counts itself on an
  atomic counter per (sequence, kv head); the last to count merges the partials in the same
  launch and zeroes the counter again (so a replayed CUDA graph finds it zeroed). At a small batch
  (fewer (sequence, kv head) pairs than SMs) the split count is rounded *down* to what is resident
  at once: the compiled kernel's registers and shared memory say how many programs fit on an SM,
  and a second wave would pay the whole latency chain (sequence length -> block table -> K/V)
  again. Why: on the H200 the two-pass kernel at B1 C8192 compiles to 137 registers (3 programs
  per SM) but was launched as 4 per SM (528 programs), so a quarter ran in a second wave, followed
  by a merge launch; its fused merge spilled (255 registers, 2 per SM).
* ``"two-pass"`` (the default, ``TWO_PASS_CONFIG``): contiguous block ranges per split, a
  second small merge kernel, or (``fused_merge``) the last-program merge of one head at a time;
  optionally the batch-1 fixed-cost variants below.

Measured side by side on the H200 (tools/h200_decode_b1.py, docs/perf/h200-decode-b1.md), the
one-pass kernel lost at every shape (B1 C8192: 22.2 us against 16.0; B32 C2048: 104 against 67),
and holding the two-pass kernel to one wave did not help either (17.1 us): the second-wave
diagnosis above was wrong. The one-pass kernel stays selectable for the next attempt; the
default is the two-pass kernel.

Batch-1 fixed cost: selectable two-pass variants (``DecodeConfig`` fields; the default uses none).
At B1 C8192 the two-pass kernel takes 16.0 us against 7.9 us of streaming the cache, while at
C32768 it reaches 0.82 of copy: about 6 us per call is fixed, and at 2 loop iterations per split
it is the chain seq_len -> split range -> table entries -> K/V, the partial stores, and a second
launch whose programs start only after the first kernel drained. Each variant removes one link
(tools/h200_decode_b1.py times them side by side; decode_sm90_compile.py shows their PTX order):

* ``interleaved``: split s takes tiles s, s+S, s+2S, ... (S splits), like the one-pass kernel.
  Where a split starts no longer depends on seq_len, so its first table read is issued together
  with the seq_len read, bounded only by the table's width (a shape); entries read past the
  sequence are never dereferenced (the K/V loads are masked by seq_len). Ranges cut from the
  table width would do the same but leave most splits idle when the table is max_model_len wide
  and the sequence short; interleaved tiles keep every split busy whatever the width, and the
  split count stays a function of shapes.
* ``pdl`` (programmatic dependent launch, sm_90+, Triton with ``launch_pdl`` and
  ``triton.language.extra.cuda.gdc_wait``): a dependent kernel is launched before the one ahead of
  it finishes and waits in ``gdc_wait`` until that kernel has completed and its writes are
  visible. ``"merge"``: the split kernel signals ``gdc_launch_dependents`` at its start, so the
  merge programs are resident when the last split finishes (no launch gap; the merge was already
  one memory round trip: the lse and partial loads are all issued before any is used).
  ``"all"``: the split kernel is launched dependent too (it waits before its first load, so it is
  safe after any kernel), hiding its own launch behind the previous kernel's tail.
  ``"early-metadata"``: as "all", but seq_len and (interleaved) the first table entries are read
  *before* the wait, taking that part of the chain off the critical path; valid only when the kernel
  launched just before decode does not write seq_lens or the block table (an engine uploads them
  before the step's first kernel; the KV store kernel just before decode writes only the cache,
  which is read after the wait). Rule for every PDL kernel here: nothing is written before the
  wait, so a reused workspace or output buffer is never written while the previous call reads it.
  Where PDL is missing (another Triton, an older GPU) ``paged_decode`` raises
  ``VariantUnavailable`` rather than run the plain kernel under the variant's name; the
  interpreter runs the same load order with the grid-dependency instructions compiled out.
* ``max_registers``: Triton's ``maxnreg``. The split kernel compiles to ~138 registers at
  Llama-3.1-8B's shapes (3 programs of 128 threads per SM) while the default launch asks for 4 per
  SM, so a quarter of the programs run in a second wave and pay the chain again; 128 registers
  (16 bytes of spill) lets all of them be resident at once.
* Fewer, longer splits, bigger tiles, deeper pipelines are the existing knobs
  (``blocks_per_iter``, ``num_warps``, ``num_stages``, ``small_batch_programs_per_sm``,
  ``max_splits``); the H200 script sweeps a grid of them on top of interleaved + PDL.

CUDA-graph contract (the engine captures decode once per batch size and replays it): nothing here
syncs with the host, and the launch (grid, number of splits, workspace size) is a function of
tensor *shapes* (number of sequences, ``block_tables.shape[1]``, heads, head size) and module
constants only (one-pass: and the compiled kernel's footprint, itself fixed by dtypes and
shapes), never of metadata values. A sequence with ``seq_len == 0`` (a padded row of a
graph batch) produces zeros.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the native path still works without Triton
    triton = None

LOG2E = 1.4426950408889634


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """Tuning knobs of the decode kernels (tools/h200_decode_b1.py times them on the H200)."""

    # "one-pass": split-KV whose last split to finish merges, in the same launch, with as many
    # programs at a small batch as are resident at once (one wave). "two-pass": the earlier kernel
    # (contiguous split ranges, a second merge launch unless fused_merge), kept for comparison.
    kernel: str = "one-pass"
    blocks_per_iter: int = 4  # cache blocks (of block_size tokens) per loop iteration
    num_warps: int = 8
    # Triton's software pipeline depth. With the block-table load ahead of the K/V loads, 5 is the
    # first depth at which Triton (3.9, sm_90) keeps two K/V tiles per program in flight.
    num_stages: int = 5
    # Split a batch until about this many programs per SM are in flight. A batch whose
    # (sequence, kv head) pairs do not fill the SMs (batch 1-16 of an 8-kv-head model on an H200)
    # is latency-bound: more, shorter splits help it; a batch that does fill them only pays for
    # splitting (workspace traffic, a merge), so it is split just enough to cover the SMs twice.
    # One-pass: a small batch is split to at most this many programs per SM *and* no more than fit
    # on an SM at once (from the compiled kernel's registers and shared memory), so there is no
    # second wave that would pay the whole latency chain again.
    programs_per_sm: int = 2
    small_batch_programs_per_sm: int = 4
    max_splits: int = 32  # one-pass: the merging program reads splits x group x head_size floats
    fused_merge: bool = False  # two-pass only: merge in the decode kernel (atomic counter)
    # Two-pass only (see the module docstring, "Batch-1 fixed cost"). interleaved: split s takes
    # tiles s, s+S, ... and its first block-table read waits on nothing (not on seq_len).
    interleaved: bool = False
    # Programmatic dependent launch: "off", "merge" (the merge kernel launches while the split
    # kernel runs), "all" (the split kernel too, after whatever kernel precedes it), or
    # "early-metadata" ("all", and seq_len / the first table entries are read before the wait), or
    # "small-batch" ("all" where the batch leaves SMs idle and PDL exists, else "off": a candidate
    # default, see small_batch_pdl).
    pdl: str = "off"
    # Two-pass split kernel: a register cap (Triton's maxnreg launch option), None for none. At
    # Llama-3.1-8B's shapes the default split kernel compiles to ~137 registers x 128 threads,
    # 3 programs per SM, so the 4-per-SM launch runs in two waves; 128 lets 4 fit at once.
    max_registers: Optional[int] = None
    # Two-pass merge kernel: programs per query head, each merging a slice of head_dim. 1 = one
    # program reads a head's every partial; more spread a many-split merge (one cache tile per
    # split at batch 1) over more SMs.
    merge_programs_per_head: int = 1
    # Kernel "blocks" only: how K/V reach shared memory. "pointers": Triton loads (cp.async when
    # pipelined); "tma": Hopper's tensor memory accelerator, one bulk copy per cache block through a
    # tensor descriptor (sm_90+, power-of-two kv heads and head size, one block per loop step).
    kv_loads: str = "pointers"


# The two-pass kernel's configuration (its H200 numbers: docs/perf/h200-attention.md and
# docs/perf/h200-decode-b1.md, where tools/h200_decode_b1.py times it beside the one-pass kernel).
TWO_PASS_CONFIG = DecodeConfig(kernel="two-pass", blocks_per_iter=4, num_warps=4, num_stages=2, programs_per_sm=2,
                               small_batch_programs_per_sm=4, max_splits=128, fused_merge=False)
ONE_PASS_CONFIG = DecodeConfig()
# Kernel "blocks" (paged_decode_blocks.py) in its best measured form, without PDL (a safe default:
# the PDL modes assume what the kernel before it writes); the H200 numbers quoted there are with
# pdl="early-metadata" (without PDL: B1 C8192 15.8 us, run 18).
BLOCKS_CONFIG = DecodeConfig(kernel="blocks", blocks_per_iter=1, num_warps=8, num_stages=3, programs_per_sm=2,
                             small_batch_programs_per_sm=1, max_splits=512, merge_programs_per_head=4)
DECODE_CONFIG = TWO_PASS_CONFIG
KERNELS = ("one-pass", "two-pass", "blocks")  # "blocks": paged_decode_blocks.py
PDL_MODES = ("off", "merge", "all", "early-metadata", "small-batch")


class VariantUnavailable(RuntimeError):
    """A DecodeConfig asks for a feature this Triton / GPU does not have (e.g. PDL before sm_90)."""


try:  # Grid dependency control (PDL), in Triton since about 3.3; older: no-op stand-ins, unavailable
    from triton.language.extra.cuda import gdc_launch_dependents as _gdc_launch_dependents
    from triton.language.extra.cuda import gdc_wait as _gdc_wait
    _HAVE_GDC = True
except Exception:  # noqa: BLE001 - any import failure means the same: no PDL
    _HAVE_GDC = False
    if triton is not None:
        @triton.jit
        def _gdc_wait():
            pass

        @triton.jit
        def _gdc_launch_dependents():
            pass


def _cuda_launch_option(name: str) -> bool:
    """Does this Triton's CUDA backend take launch option ``name`` (``launch_pdl``, ``maxnreg``)?
    An unknown launch option is silently dropped by Triton, so without this check a variant would
    run as the default kernel (and its timing would be mislabelled)."""
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except Exception:  # noqa: BLE001
        return False
    return name in getattr(CUDAOptions, "__dataclass_fields__", {})


def pdl_unavailable_reason(device: torch.device) -> Optional[str]:
    """None when the PDL variants run with PDL on ``device``; else why not. Off the GPU (the
    interpreter) the variants run with the grid-dependency calls compiled out, so the reason
    is given but ``paged_decode`` does not refuse them there."""
    if triton is None:
        return "no Triton"
    if device.type != "cuda":
        return "not a CUDA device (the interpreter has no dependent launches)"
    return _cuda_pdl_unavailable_reason(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _cuda_pdl_unavailable_reason(device_index: int) -> Optional[str]:
    # cached: paged_decode asks on every call of a PDL config, and the answer never changes
    device = torch.device("cuda", device_index)
    if not _HAVE_GDC:
        return f"triton {triton.__version__} has no triton.language.extra.cuda.gdc_wait"
    if not _cuda_launch_option("launch_pdl"):
        return f"triton {triton.__version__} has no launch_pdl launch option"
    major, _ = torch.cuda.get_device_capability(device)
    if major < 9:
        return f"sm_{major}x: programmatic dependent launch needs sm_90 or newer"
    return None


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """SMs of a CUDA device; the interpreter on the CPU is given a small fixed machine."""
    if device.type != "cuda":
        return 4
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def decode_num_splits(num_seqs: int, num_kv_heads: int, max_blocks: int, num_sms: int,
                      config: DecodeConfig = DECODE_CONFIG, resident_per_sm: Optional[int] = None) -> int:
    """Splits per sequence, from shapes only: enough programs to fill the GPU, never more splits
    than a full-width block table has loop iterations (so a long sequence never has an idle split
    for lack of blocks), at least one. ``resident_per_sm``: programs of the compiled one-pass
    kernel that fit on one SM at once (None: unknown, the config's figure is trusted)."""
    programs = max(num_seqs * num_kv_heads, 1)
    iterations = max(-(-max_blocks // config.blocks_per_iter), 1)
    if config.kernel == "one-pass" and programs < num_sms:
        # Latency-bound: as many programs as run at once, rounded *down* so all start together.
        per_sm = config.small_batch_programs_per_sm
        if resident_per_sm:
            per_sm = min(per_sm, resident_per_sm)
        wanted = per_sm * num_sms // programs
    else:
        per_sm = config.small_batch_programs_per_sm if programs < num_sms else config.programs_per_sm
        wanted = -(-per_sm * num_sms // programs)
    return max(1, min(wanted, iterations, config.max_splits))


def _check_inputs(query, key_cache, value_cache, block_tables, seq_lens):
    if query.dim() != 3 or key_cache.dim() != 4 or key_cache.shape != value_cache.shape:
        raise ValueError(f"expected query [B, nq, d] and caches [blocks, block_size, nk, d], got "
                         f"{tuple(query.shape)}, {tuple(key_cache.shape)}, {tuple(value_cache.shape)}")
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, cache_dim = key_cache.shape
    if cache_dim != head_dim or num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads of size {head_dim} do not fit a cache of "
                         f"{num_kv_heads} kv heads of size {cache_dim}")
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs or seq_lens.shape != (num_seqs,):
        raise ValueError(f"block_tables {tuple(block_tables.shape)} / seq_lens {tuple(seq_lens.shape)} "
                         f"do not describe {num_seqs} sequences")
    if key_cache.stride(-1) != 1 or value_cache.stride(-1) != 1:
        raise ValueError("the KV cache must have a unit stride over the head dimension")


def paged_decode(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                 block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                 out: Optional[torch.Tensor] = None, config: Optional[DecodeConfig] = None,
                 num_splits: Optional[int] = None) -> torch.Tensor:
    """Attention of one query token per sequence over its paged history.

    query [B, nq, d] (any strides with a unit last stride: a view of the fused qkv is fine);
    key_cache / value_cache [num_blocks, block_size, nk, d]; block_tables [B, max_blocks] int32;
    seq_lens [B] int32 (tokens in the cache, including this step's). Returns ``out`` [B, nq, d]
    (allocated in the query's dtype when not given). ``num_splits`` overrides the shape-derived
    choice (tests use it to force uneven partitions). ``config.kernel`` picks the kernel.
    """
    if triton is None:
        raise RuntimeError("paged_decode needs Triton")
    config = config or DECODE_CONFIG
    if config.kernel not in KERNELS:
        raise ValueError(f"unknown decode kernel {config.kernel!r}; expected one of {KERNELS}")
    if config.pdl not in PDL_MODES:
        raise ValueError(f"unknown pdl mode {config.pdl!r}; expected one of {PDL_MODES}")
    if config.kernel == "one-pass" and (config.pdl != "off" or config.interleaved):
        raise ValueError("pdl and interleaved are options of the two-pass kernel")
    if config.kernel == "blocks" and (config.interleaved or config.fused_merge or config.max_registers is not None):
        raise ValueError("interleaved, fused_merge and max_registers are options of the two-pass kernel, "
                         "not of kernel 'blocks'")
    if config.kv_loads not in ("pointers", "tma"):
        raise ValueError(f"unknown kv_loads {config.kv_loads!r}; expected 'pointers' or 'tma'")
    if config.kv_loads == "tma" and config.kernel != "blocks":
        raise ValueError("kv_loads='tma' is an option of kernel 'blocks'")
    if config.pdl == "small-batch":
        usable = query.is_cuda and not torch.compiler.is_compiling() and pdl_unavailable_reason(query.device) is None
        config = small_batch_pdl(config, query.shape[0] * key_cache.shape[2], sm_count(query.device), usable)
    if config.pdl != "off" and query.is_cuda:
        reason = pdl_unavailable_reason(query.device)
        if reason:
            raise VariantUnavailable(f"DecodeConfig(pdl={config.pdl!r}): {reason}")
    mpph = config.merge_programs_per_head
    if mpph < 1 or mpph & (mpph - 1):
        raise ValueError(f"merge_programs_per_head must be a power of two, got {mpph}")
    if config.max_registers is not None:
        if config.kernel != "two-pass":
            raise ValueError("max_registers is an option of the two-pass kernel")
        if query.is_cuda and not _cuda_launch_option("maxnreg"):
            raise VariantUnavailable(f"DecodeConfig(max_registers=...): triton {triton.__version__} has no maxnreg")
    _check_inputs(query, key_cache, value_cache, block_tables, seq_lens)
    if query.stride(-1) != 1:
        query = query.contiguous()
    if block_tables.stride(-1) != 1:
        block_tables = block_tables.contiguous()
    if out is None:
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    if query.shape[0] == 0:
        return out
    tile = config.blocks_per_iter * key_cache.shape[1]
    if tile < 16 or tile & (tile - 1):
        raise ValueError(f"blocks_per_iter * block_size must be a power of two >= 16, got {tile}")
    if config.kernel == "blocks":
        from .paged_decode_blocks import launch_blocks as launch
    else:
        launch = _launch_one_pass if config.kernel == "one-pass" else _launch_two_pass
    launch(query, key_cache, value_cache, block_tables, seq_lens, scale, out, config, num_splits)
    return out


@functools.lru_cache(maxsize=None)
def small_batch_pdl(config: DecodeConfig, programs: int, num_sms: int, pdl_usable: bool) -> DecodeConfig:
    """What pdl="small-batch" runs: "all" when the batch's (sequence, kv head) pairs leave SMs idle
    (B1-B16 of an 8-KV-head model on an H200), where the H200 measured it 2-10% faster than no PDL;
    "off" at larger batches (34% slower at B32 C2048: docs/perf/h200-decode-b1.md, run 3), where PDL
    is missing, off the GPU and under torch.compile. A function of shapes: graph-safe."""
    return dataclasses.replace(config, pdl="all" if pdl_usable and programs < num_sms else "off")


def _f32_dot(query: torch.Tensor) -> bool:
    # float32 inputs keep full precision (no TF32); Triton's interpreter multiplies bfloat16
    # tiles wrongly (it reads their raw bits), so off the GPU half tiles are upcast first.
    return query.dtype == torch.float32 or not query.is_cuda


def _launch_two_pass(query, key_cache, value_cache, block_tables, seq_lens, scale, out, config, num_splits):
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    group = num_heads // num_kv_heads
    splits = num_splits or decode_num_splits(num_seqs, num_kv_heads, block_tables.shape[1],
                                             sm_count(query.device), config)
    # tl.dot wants every tile dimension >= 16; padded query rows are computed and dropped.
    group_pad = max(16, triton.next_power_of_2(group))
    dim_pad = max(16, triton.next_power_of_2(head_dim))
    fused_merge = splits > 1 and config.fused_merge
    part_out, part_lse = split_workspace(out, splits)
    counters = _split_counters(query.device, num_seqs * num_kv_heads) if fused_merge else seq_lens
    # PDL: the grid-dependency instructions exist only in compiled code (paged_decode has refused
    # a CUDA device without them); the interpreter runs the same load order without them.
    gdc = config.pdl != "off" and query.is_cuda
    split_pdl = gdc and config.pdl in ("all", "early-metadata")  # the split kernel itself launched dependent
    merge_kernel = splits > 1 and not fused_merge
    _paged_decode_kernel[(num_seqs, num_kv_heads, splits)](
        query, key_cache, value_cache, block_tables, seq_lens, out, part_out, part_lse, counters,
        scale * LOG2E,
        query.stride(0), query.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1), block_tables.shape[1],
        GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=head_dim, DIM_PAD=dim_pad,
        BLOCK_SIZE=block_size, BLOCKS_PER_ITER=config.blocks_per_iter, SPLIT=splits > 1,
        # The merge's tile sizes are read only by the fused merge: constants otherwise, so that the
        # plain split kernel is compiled once.
        FUSED_MERGE=fused_merge, GROUP_POW2=triton.next_power_of_2(group) if fused_merge else 1,
        MERGE_CHUNK=_merge_chunk(group, dim_pad, config.num_warps) if fused_merge else 1,
        F32_DOT=_f32_dot(query), INTERLEAVED=config.interleaved, EARLY_METADATA=config.pdl == "early-metadata",
        PDL_WAIT=split_pdl, PDL_TRIGGER=gdc and merge_kernel,
        num_warps=config.num_warps, num_stages=config.num_stages,
        **_launch_options(split_pdl, config.max_registers if query.is_cuda else None),
    )
    if merge_kernel:
        run_merge(part_out, part_lse, out, splits, *merge_launch(splits, head_dim, dim_pad,
                                                                 config.merge_programs_per_head, gdc))


def split_workspace(out: torch.Tensor, splits: int):
    """(partial outputs [seq, head, split, width] float32, their log-sum-exps [seq, head, split])
    for ``out`` [seq, head, width]: the rows the merge kernel reads. One split writes ``out``
    directly, so both are then ``out`` itself (the pointers are unused)."""
    if splits <= 1:
        return out, out
    num_seqs, num_heads, width = out.shape
    return (torch.empty(num_seqs, num_heads, splits, width, dtype=torch.float32, device=out.device),
            torch.empty(num_seqs, num_heads, splits, dtype=torch.float32, device=out.device))


MERGE_STEP_FLOATS = 16384  # partial floats a merge program loads per step


def merge_launch(splits: int, head_dim: int, dim_pad: int, programs_per_head: int, pdl: bool):
    """The merge kernel's programs per head and constants: each program merges DIM_CHUNK of a
    head's head_dim, SPLIT_CHUNK splits per step, a step's partials at most 16384 floats (128 per
    thread of 4 warps: one step, one round trip, up to 128 splits of head size 128)."""
    dim_chunk = max(1, dim_pad // programs_per_head)  # more programs than padded head_dim: one element each
    split_chunk = min(triton.next_power_of_2(splits), max(1, MERGE_STEP_FLOATS // dim_chunk))
    return merge_meta(splits, head_dim, dim_chunk, split_chunk, pdl)


def merge_meta(splits: int, head_dim: int, dim_chunk: int, split_chunk: int, pdl: bool):
    """(programs per head, the merge kernel's constants) for slices of ``dim_chunk`` and steps of
    ``split_chunk`` splits; a slice wholly past a non-power-of-two head_dim is not launched."""
    return -(-head_dim // dim_chunk), dict(HEAD_DIM=head_dim, DIM_CHUNK=dim_chunk, SPLIT_CHUNK=split_chunk,
                                           ONE_STEP=split_chunk >= splits, PDL=pdl)


def run_merge(part_out, part_lse, out, splits: int, chunks: int, meta: dict):
    """The merge kernel over ``split_workspace``'s rows into ``out`` [seq, head, width]."""
    _merge_splits_kernel[(out.shape[0], out.shape[1], chunks)](
        part_out, part_lse, out, out.stride(0), out.stride(1), splits, **meta,
        num_warps=4, **_launch_options(meta["PDL"]))


def _launch_options(pdl: bool, max_registers: Optional[int] = None) -> dict:
    # Passed only when asked for: the default launch stays what it was (and a Triton without
    # the option is never handed it: paged_decode has refused the variant there).
    options = {"launch_pdl": True} if pdl else {}
    if max_registers is not None:
        options["maxnreg"] = max_registers
    return options


def _merge_chunk(group: int, dim_pad: int, num_warps: int) -> int:
    """Splits merged per step by a fused merge: MERGE_CHUNK x group x head_size floats, about 64 per
    thread (a power of two)."""
    chunk = max(1, (64 * 32 * num_warps) // (triton.next_power_of_2(group) * dim_pad))
    return 1 << (chunk.bit_length() - 1)


def _launch_one_pass(query, key_cache, value_cache, block_tables, seq_lens, scale, out, config, num_splits):
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    group = num_heads // num_kv_heads
    group_pow2 = triton.next_power_of_2(group)
    dim_pad = max(16, triton.next_power_of_2(head_dim))
    merge_chunk = _merge_chunk(group, dim_pad, config.num_warps)

    def launch(grid, split, part_out, part_lse, counters, warmup=False):
        args = (query, key_cache, value_cache, block_tables, seq_lens, out, part_out, part_lse, counters,
                scale * LOG2E,
                query.stride(0), query.stride(1),
                key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
                value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
                block_tables.stride(0), out.stride(0), out.stride(1))
        # tl.dot wants every tile dimension >= 16; padded query rows are computed and dropped.
        meta = dict(GROUP=group, GROUP_PAD=max(16, group_pow2), GROUP_POW2=group_pow2, HEAD_DIM=head_dim,
                    DIM_PAD=dim_pad, BLOCK_SIZE=block_size, BLOCKS_PER_ITER=config.blocks_per_iter, SPLIT=split,
                    MERGE_CHUNK=merge_chunk, F32_DOT=_f32_dot(query),
                    num_warps=config.num_warps, num_stages=config.num_stages)
        if warmup:
            return _decode_one_pass_kernel.warmup(*args, grid=grid, **meta)
        return _decode_one_pass_kernel[grid](*args, **meta)

    splits = num_splits or one_pass_plan(query, key_cache, block_tables, config,
                                         lambda: launch((1, 1, 1), True, out, out, seq_lens, warmup=True))["splits"]
    if splits > 1:
        rows = num_seqs * num_kv_heads * splits * group  # [seq, kv head, split, group] rows
        part_out = torch.empty(rows, head_dim, dtype=torch.float32, device=query.device)
        part_lse = torch.empty(rows, dtype=torch.float32, device=query.device)
        counters = _split_counters(query.device, num_seqs * num_kv_heads)
    else:  # one split writes the final output directly; the workspace pointers are unused
        part_out = part_lse = out
        counters = seq_lens
    launch((num_seqs, num_kv_heads, splits), splits > 1, part_out, part_lse, counters)


_RESIDENT: dict = {}


def one_pass_plan(query: torch.Tensor, key_cache: torch.Tensor, block_tables: torch.Tensor,
                  config: DecodeConfig = DECODE_CONFIG, compile_split_kernel=None) -> dict:
    """The one-pass launch for these shapes: ``splits`` per sequence and ``resident_per_sm``
    (programs of the split kernel that fit on one SM at once; None off the GPU or before the
    kernel was compiled when ``compile_split_kernel`` is not given)."""
    num_seqs, _, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    resident = None
    if query.is_cuda and num_seqs * num_kv_heads < sm_count(query.device):
        key = (query.device, query.dtype, key_cache.dtype, query.shape[1] // num_kv_heads, head_dim, block_size,
               config)
        resident = _RESIDENT.get(key)
        if resident is None and compile_split_kernel is not None:  # compile once, read the footprint
            resident = _RESIDENT[key] = _resident_programs_per_sm(compile_split_kernel, query.device)
    splits = decode_num_splits(num_seqs, num_kv_heads, block_tables.shape[1], sm_count(query.device), config,
                               resident)
    return {"splits": splits, "resident_per_sm": resident}


def _resident_programs_per_sm(compile_kernel, device: torch.device) -> Optional[int]:
    """Programs of a kernel (``compile_kernel()`` returns Triton's compiled kernel) that fit on one
    SM at once (registers, shared memory, threads), or None when the compiled kernel or the device
    does not say (a kernel that does not compile fails at its launch, with Triton's own message)."""
    try:
        compiled = compile_kernel()
        compiled._init_handles()
        regs, shared, warps = compiled.n_regs, compiled.metadata.shared, compiled.metadata.num_warps
        props = torch.cuda.get_device_properties(device)
    except Exception:  # noqa: BLE001 - another Triton's internals: fall back to the config
        return None
    regs_per_warp = -(-max(regs, 1) * 32 // 256) * 256  # registers are allocated per warp, 256 at a time
    by_regs = getattr(props, "regs_per_multiprocessor", 65536) // (regs_per_warp * warps)
    by_smem = getattr(props, "shared_memory_per_multiprocessor", 233472) // (shared + 1024)  # 1 KiB reserved per block
    by_threads = props.max_threads_per_multi_processor // (32 * warps)
    return max(1, min(by_regs, by_smem, by_threads, 32))


_COUNTERS: dict = {}


def _split_counters(device: torch.device, needed: int) -> torch.Tensor:
    """Zeroed int32 counters, one per (sequence, kv head), for the fused merge. Kept per device and
    reused: every launch leaves them at zero again (the merging program resets its counter). A
    buffer first needed inside a CUDA-graph capture is not cached: its zero fill is then a node of
    the graph (it would not have run yet when the capture ends)."""
    buf = _COUNTERS.get(device)
    if buf is not None and buf.numel() >= needed:
        return buf
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    buf = torch.zeros(max(needed, 1024), dtype=torch.int32, device=device)
    if not capturing:
        _COUNTERS[device] = buf
    return buf


def decode_workspace_bytes(num_seqs: int, num_heads: int, head_dim: int, splits: int) -> int:
    """Bytes of the split workspace (partial outputs + log-sum-exps), for cost accounting."""
    return 0 if splits <= 1 else num_seqs * num_heads * splits * (head_dim + 1) * 4


if triton is not None:

    @triton.jit
    def _split_start(PDL_TRIGGER: tl.constexpr, PDL_WAIT: tl.constexpr, EARLY_METADATA: tl.constexpr):
        """A split kernel's first instructions (two-pass and blocks kernels). PDL_TRIGGER: the merge
        kernel may be launched now; its programs become resident and wait (at their gdc_wait) for
        this whole grid, instead of being launched after it drains. PDL_WAIT: launched as a
        dependent of whatever kernel came before, so nothing is read (or written) before that kernel
        has finished and its writes are visible, except, with EARLY_METADATA, seq_len and the first
        table entries (then ``_metadata_read`` waits after them)."""
        if PDL_TRIGGER:
            _gdc_launch_dependents()
        if PDL_WAIT and not EARLY_METADATA:
            _gdc_wait()

    @triton.jit
    def _metadata_read(PDL_WAIT: tl.constexpr, EARLY_METADATA: tl.constexpr):
        """After a split kernel's seq_len and first table reads. EARLY_METADATA: they were requested
        before the wait, overlapping the previous kernel's tail; valid only when that kernel does
        not write seq_lens or the block table (an engine uploads them before the step's first
        kernel). Now the wait, before q and K/V are read."""
        if EARLY_METADATA:
            if PDL_WAIT:
                _gdc_wait()

    @triton.jit
    def attend_tile(q, k_t, v, score_mask, m, l, acc, scale_log2, F32_DOT: tl.constexpr):
        """One online-softmax step of a split over a K/V tile: scores q k^T in log2 units (masked
        by ``score_mask`` to -inf), the running max ``m``, sum ``l`` and output ``acc`` rescaled
        and updated; returns them. ``k_t`` is the K tile transposed ([..., head_size, tokens]);
        2D tiles and batched 3D ones alike (the tokens are the last axis of the scores). P@V takes
        p at the cache's precision, as on tensor cores. ``F32_DOT``: float32 products (float32
        inputs; the interpreter, which multiplies half-precision tiles wrongly)."""
        if F32_DOT:
            s = tl.dot(q.to(tl.float32), k_t.to(tl.float32), input_precision="ieee")
        else:
            s = tl.dot(q, k_t)
        s = tl.where(score_mask, s * scale_log2, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=-1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - tl.expand_dims(m_new, -1))
        l = l * alpha + tl.sum(p, axis=-1)
        p_low = p.to(v.dtype)
        if F32_DOT:
            pv = tl.dot(p_low.to(tl.float32), v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p_low, v)
        return m_new, l, acc * tl.expand_dims(alpha, -1) + pv

    @triton.jit
    def _paged_decode_kernel(
        q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, out_ptr, part_out_ptr, part_lse_ptr,
        counters_ptr, scale_log2,
        q_s_seq, q_s_head,
        k_s_block, k_s_tok, k_s_head,
        v_s_block, v_s_tok, v_s_head,
        bt_s_seq, o_s_seq, o_s_head, table_width,
        GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr,
        BLOCK_SIZE: tl.constexpr, BLOCKS_PER_ITER: tl.constexpr, SPLIT: tl.constexpr,
        FUSED_MERGE: tl.constexpr, GROUP_POW2: tl.constexpr, MERGE_CHUNK: tl.constexpr, F32_DOT: tl.constexpr,
        INTERLEAVED: tl.constexpr, EARLY_METADATA: tl.constexpr, PDL_WAIT: tl.constexpr,
        PDL_TRIGGER: tl.constexpr,
    ):
        seq = tl.program_id(0).to(tl.int64)
        kv_head = tl.program_id(1)
        split = tl.program_id(2)
        num_splits = tl.num_programs(2)
        TILE: tl.constexpr = BLOCKS_PER_ITER * BLOCK_SIZE
        _split_start(PDL_TRIGGER, PDL_WAIT, EARLY_METADATA)

        t = tl.arange(0, TILE)
        block_of_token = t // BLOCK_SIZE
        offset_in_block = t % BLOCK_SIZE
        table = block_tables_ptr + seq * bt_s_seq
        seq_len = tl.load(seq_lens_ptr + seq)
        num_blocks = tl.cdiv(seq_len, BLOCK_SIZE)
        if INTERLEAVED:
            # Split s takes tiles s, s+S, s+2S, ...: where a split starts is known without seq_len,
            # so its first table read is issued together with the seq_len read (bounded by the
            # table's width, a shape) instead of after it. Entries read past the sequence are never
            # dereferenced: the K/V loads are masked by seq_len. Unlike ranges cut from the table
            # width, every split still gets work when the table is much wider than the sequence.
            block_start = split * BLOCKS_PER_ITER
            block_end = num_blocks
            block_step = num_splits * BLOCKS_PER_ITER
            physical = tl.load(table + block_start + block_of_token,
                               mask=block_start + block_of_token < table_width, other=0)
        else:
            # This split's share of the sequence, in whole loop iterations (blocks_per_iter blocks
            # each), so that only the last tile of the sequence is partial.
            per_split = tl.cdiv(tl.cdiv(num_blocks, num_splits), BLOCKS_PER_ITER) * BLOCKS_PER_ITER
            block_start = split * per_split
            block_end = tl.minimum(block_start + per_split, num_blocks)
            block_step = BLOCKS_PER_ITER
        _metadata_read(PDL_WAIT, EARLY_METADATA)

        g = tl.arange(0, GROUP_PAD)
        d = tl.arange(0, DIM_PAD)
        heads = kv_head * GROUP + g
        row_mask = (g < GROUP)[:, None] & (d < HEAD_DIM)[None, :]
        q = tl.load(q_ptr + seq * q_s_seq + heads[:, None] * q_s_head + d[None, :], mask=row_mask, other=0.0)

        d_mask = (d < HEAD_DIM)[None, :]
        if not INTERLEAVED:
            # Table entries of the first tile; inside the loop, those of the next tile are requested
            # before this tile's math, so a K/V load never waits on a table load.
            physical = tl.load(table + block_start + block_of_token,
                               mask=block_start * BLOCK_SIZE + t < seq_len, other=0)
        m = tl.full([GROUP_PAD], float("-inf"), tl.float32)  # running max, in log2 units
        l = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, DIM_PAD], tl.float32)
        for block in range(block_start, block_end, block_step):
            valid = block * BLOCK_SIZE + t < seq_len
            kv_mask = valid[:, None] & d_mask
            rows = physical.to(tl.int64)[:, None]
            # K and V requested together: both reads are in flight while the QK dot waits on K.
            k = tl.load(k_cache_ptr + rows * k_s_block + offset_in_block[:, None] * k_s_tok
                        + kv_head * k_s_head + d[None, :], mask=kv_mask, other=0.0)
            v = tl.load(v_cache_ptr + rows * v_s_block + offset_in_block[:, None] * v_s_tok
                        + kv_head * v_s_head + d[None, :], mask=kv_mask, other=0.0)
            next_block = block + block_step
            physical = tl.load(table + next_block + block_of_token,
                               mask=next_block * BLOCK_SIZE + t < tl.minimum(seq_len, block_end * BLOCK_SIZE), other=0)
            m, l, acc = attend_tile(q, tl.trans(k), v, valid[None, :], m, l, acc, scale_log2, F32_DOT)

        has_work = l > 0.0  # false for an empty split and for a padded row (seq_len 0)
        result = acc / tl.where(has_work, l, 1.0)[:, None]
        if SPLIT:
            row = (seq * tl.num_programs(1) * GROUP + heads) * num_splits + split
            tl.store(part_out_ptr + row[:, None] * HEAD_DIM + d[None, :], result, mask=row_mask)
            lse = tl.where(has_work, m + tl.log2(tl.where(has_work, l, 1.0)), float("-inf"))
            tl.store(part_lse_ptr + row, lse, mask=g < GROUP)
            if FUSED_MERGE:
                # Every thread's partial stores happen before the counter's release (barrier, then
                # an acq_rel atomic at GPU scope); the split that counts last sees all partials.
                tl.debug_barrier()
                counter = counters_ptr + seq * tl.num_programs(1) + kv_head
                finished_before = tl.atomic_add(counter, 1, sem="acq_rel")
                if finished_before == num_splits - 1:
                    tl.atomic_xchg(counter, 0)  # zero again for the next launch / graph replay
                    # The group's heads at once, MERGE_CHUNK splits at a time: merging a head's
                    # SPLITS_PAD x head_dim floats in one piece spilled (255 registers on the H200).
                    # Rows [seq, head, split]: split stride 1, head stride num_splits.
                    _merge_group(part_out_ptr, part_lse_ptr, out_ptr,
                                 (seq * tl.num_programs(1) * GROUP + kv_head * GROUP) * num_splits,
                                 seq * o_s_seq + kv_head * GROUP * o_s_head, o_s_head, num_splits,
                                 1, num_splits, GROUP, GROUP_POW2, HEAD_DIM, DIM_PAD, MERGE_CHUNK)
        else:
            tl.store(out_ptr + seq * o_s_seq + heads[:, None] * o_s_head + d[None, :],
                     result.to(out_ptr.dtype.element_ty), mask=row_mask)

    @triton.jit
    def _merge_splits_kernel(
        part_out_ptr, part_lse_ptr, out_ptr, o_s_seq, o_s_head, num_splits,
        HEAD_DIM: tl.constexpr, DIM_CHUNK: tl.constexpr, SPLIT_CHUNK: tl.constexpr, ONE_STEP: tl.constexpr,
        PDL: tl.constexpr,
    ):
        """out = sum_s w_s * part_s / sum_s w_s with w_s = 2^(lse_s - max lse), for one head
        (program axis 1) and DIM_CHUNK of its head_dim (axis 2), SPLIT_CHUNK splits per step with
        a running max. Each step's lse and partial loads are issued before either is used (one
        round trip per step). Partials are read at L2 (``.cg``): the split kernel just wrote them."""
        seq = tl.program_id(0).to(tl.int64)
        head = tl.program_id(1)
        if PDL:
            # Launched while the split kernel still runs: let the next dependent kernel launch too,
            # then wait until the split kernel has finished and its partials are visible. Nothing
            # is read or written before the wait.
            _gdc_launch_dependents()
            _gdc_wait()
        row0 = (seq * tl.num_programs(1) + head) * num_splits
        s = tl.arange(0, SPLIT_CHUNK)
        d = tl.program_id(2) * DIM_CHUNK + tl.arange(0, DIM_CHUNK)
        d_mask = d < HEAD_DIM
        if ONE_STEP:
            # Every split in one step, without the running max (straight-line code: on the H200 the
            # loop form of one step cost the B1 C8192 decode about 0.5 us, docs/perf run 11).
            s_mask = s < num_splits
            lse = tl.load(part_lse_ptr + row0 + s, mask=s_mask, other=float("-inf"), cache_modifier=".cg")
            parts = tl.load(part_out_ptr + (row0 + s)[:, None] * HEAD_DIM + d[None, :],
                            mask=s_mask[:, None] & d_mask[None, :], other=0.0, cache_modifier=".cg")
            top = tl.max(lse, axis=0)
            top = tl.where(top == float("-inf"), 0.0, top)  # every split empty: weights 0, output 0
            w = tl.exp2(lse - top)
            total = tl.sum(w, axis=0)
            merged = tl.sum(parts * w[:, None], axis=0) / tl.where(total > 0.0, total, 1.0)
            tl.store(out_ptr + seq * o_s_seq + head * o_s_head + d, merged.to(out_ptr.dtype.element_ty), mask=d_mask)
            return
        top = tl.max(tl.full([SPLIT_CHUNK], float("-inf"), tl.float32), axis=0)
        total = tl.sum(tl.zeros([SPLIT_CHUNK], tl.float32), axis=0)
        merged = tl.zeros([DIM_CHUNK], tl.float32)
        for first in range(0, num_splits, SPLIT_CHUNK):
            s_mask = first + s < num_splits
            lse = tl.load(part_lse_ptr + row0 + first + s, mask=s_mask, other=float("-inf"), cache_modifier=".cg")
            parts = tl.load(part_out_ptr + (row0 + first + s)[:, None] * HEAD_DIM + d[None, :],
                            mask=s_mask[:, None] & d_mask[None, :], other=0.0, cache_modifier=".cg")
            new_top = tl.maximum(top, tl.max(lse, axis=0))
            base = tl.where(new_top == float("-inf"), 0.0, new_top)  # every split so far empty: weights 0
            w = tl.exp2(lse - base)
            rescale = tl.exp2(top - base)
            total = total * rescale + tl.sum(w, axis=0)
            merged = merged * rescale + tl.sum(parts * w[:, None], axis=0)
            top = new_top
        merged = merged / tl.where(total > 0.0, total, 1.0)
        tl.store(out_ptr + seq * o_s_seq + head * o_s_head + d, merged.to(out_ptr.dtype.element_ty), mask=d_mask)

    @triton.jit
    def _decode_one_pass_kernel(
        q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, out_ptr, part_out_ptr, part_lse_ptr,
        counters_ptr, scale_log2,
        q_s_seq, q_s_head,
        k_s_block, k_s_tok, k_s_head,
        v_s_block, v_s_tok, v_s_head,
        bt_s_seq, o_s_seq, o_s_head,
        GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, GROUP_POW2: tl.constexpr, HEAD_DIM: tl.constexpr,
        DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCKS_PER_ITER: tl.constexpr,
        SPLIT: tl.constexpr, MERGE_CHUNK: tl.constexpr, F32_DOT: tl.constexpr,
    ):
        """One program per (sequence, kv head, split); split s takes tiles s, s + S, s + 2S, ... of
        the sequence (a tile = BLOCKS_PER_ITER cache blocks). With S > 1 the last split of a
        (sequence, kv head) to finish merges all of them, in the same launch."""
        seq = tl.program_id(0).to(tl.int64)
        kv_head = tl.program_id(1)
        split = tl.program_id(2)
        num_kv_heads = tl.num_programs(1)
        num_splits = tl.num_programs(2)
        TILE: tl.constexpr = BLOCKS_PER_ITER * BLOCK_SIZE

        seq_len = tl.load(seq_lens_ptr + seq)
        num_tiles = tl.cdiv(seq_len, TILE)

        g = tl.arange(0, GROUP_PAD)
        d = tl.arange(0, DIM_PAD)
        heads = kv_head * GROUP + g
        d_mask = (d < HEAD_DIM)[None, :]
        row_mask = (g < GROUP)[:, None] & d_mask
        q = tl.load(q_ptr + seq * q_s_seq + heads[:, None] * q_s_head + d[None, :], mask=row_mask, other=0.0)

        t = tl.arange(0, TILE)
        offset_in_block = t % BLOCK_SIZE
        table = block_tables_ptr + seq * bt_s_seq
        k_base = k_cache_ptr + kv_head * k_s_head + offset_in_block[:, None] * k_s_tok + d[None, :]
        v_base = v_cache_ptr + kv_head * v_s_head + offset_in_block[:, None] * v_s_tok + d[None, :]
        m = tl.full([GROUP_PAD], float("-inf"), tl.float32)  # running max, in log2 units
        l = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, DIM_PAD], tl.float32)
        # Interleaved tiles: every split's share differs by at most one tile, and a split's first
        # table read does not depend on how the sequence is divided.
        for tile in range(split, num_tiles, num_splits):
            token = tile * TILE + t
            valid = token < seq_len
            physical = tl.load(table + token // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
            kv_mask = valid[:, None] & d_mask
            k = tl.load(k_base + physical[:, None] * k_s_block, mask=kv_mask, other=0.0)
            v = tl.load(v_base + physical[:, None] * v_s_block, mask=kv_mask, other=0.0)
            m, l, acc = attend_tile(q, tl.trans(k), v, valid[None, :], m, l, acc, scale_log2, F32_DOT)

        has_work = l > 0.0  # false for a split without tiles and for a padded row (seq_len 0)
        result = acc / tl.where(has_work, l, 1.0)[:, None]
        if not SPLIT:
            tl.store(out_ptr + seq * o_s_seq + heads[:, None] * o_s_head + d[None, :],
                     result.to(out_ptr.dtype.element_ty), mask=row_mask)
        else:
            # Workspace rows [seq, kv head, split, group]: a (seq, kv head)'s partials are contiguous.
            pair = seq * num_kv_heads + kv_head
            # Only splits with tiles write (the merge reads those); the split test is broadcast to
            # a tensor because Triton's interpreter rejects a scalar inside a mask.
            row = (pair * num_splits + split) * GROUP + g
            row_live = (g < GROUP) & (tl.zeros([GROUP_PAD], tl.int32) + split < num_tiles)
            tl.store(part_out_ptr + row[:, None] * HEAD_DIM + d[None, :], result,
                     mask=row_live[:, None] & d_mask)
            lse = m + tl.log2(tl.where(has_work, l, 1.0))
            tl.store(part_lse_ptr + row, lse, mask=row_live)
            # Every thread's partial stores happen before the counter's release (barrier, then an
            # acq_rel atomic at GPU scope); the split that counts last sees all partials.
            tl.debug_barrier()
            counter = counters_ptr + pair
            finished_before = tl.atomic_add(counter, 1, sem="acq_rel")
            if finished_before == num_splits - 1:
                tl.atomic_xchg(counter, 0)  # zero again for the next launch / graph replay
                _merge_group(part_out_ptr, part_lse_ptr, out_ptr, pair * num_splits * GROUP,
                             seq * o_s_seq + kv_head * GROUP * o_s_head, o_s_head,
                             tl.minimum(num_tiles, num_splits), GROUP, 1, GROUP, GROUP_POW2, HEAD_DIM,
                             DIM_PAD, MERGE_CHUNK)

    @triton.jit
    def _merge_group(part_out_ptr, part_lse_ptr, out_ptr, row0, out_offset, o_s_head, active_splits,
                     split_stride, head_stride,
                     GROUP: tl.constexpr, GROUP_POW2: tl.constexpr, HEAD_DIM: tl.constexpr,
                     DIM_PAD: tl.constexpr, MERGE_CHUNK: tl.constexpr):
        """The GROUP heads of one (sequence, kv head) from its first ``active_splits`` partials (the
        splits that had tiles), MERGE_CHUNK splits at a time with a running max; the partial of
        split s, head g is row ``row0 + s * split_stride + g * head_stride``. Partials are read
        at L2 (``.cg``): other SMs wrote them during this launch."""
        c = tl.arange(0, MERGE_CHUNK)[:, None]
        g = tl.arange(0, GROUP_POW2)[None, :]
        d = tl.arange(0, DIM_PAD)[None, None, :]
        top = tl.full([GROUP_POW2], float("-inf"), tl.float32)
        total = tl.zeros([GROUP_POW2], tl.float32)
        merged = tl.zeros([GROUP_POW2, DIM_PAD], tl.float32)
        for first in range(0, active_splits, MERGE_CHUNK):
            mask = ((first + c) < active_splits) & (g < GROUP)  # [chunk, group]
            row = row0 + (first + c) * split_stride + g * head_stride
            lse = tl.load(part_lse_ptr + row, mask=mask, other=float("-inf"), cache_modifier=".cg")
            parts = tl.load(part_out_ptr + row[:, :, None] * HEAD_DIM + d,
                            mask=mask[:, :, None] & (d < HEAD_DIM), other=0.0, cache_modifier=".cg")
            new_top = tl.maximum(top, tl.max(lse, axis=0))
            base = tl.where(new_top == float("-inf"), 0.0, new_top)  # nothing yet: weights 0
            w = tl.exp2(lse - base[None, :])
            rescale = tl.exp2(top - base)
            total = total * rescale + tl.sum(w, axis=0)
            merged = merged * rescale[:, None] + tl.sum(parts * w[:, :, None], axis=0)
            top = new_top
        merged = merged / tl.where(total > 0.0, total, 1.0)[:, None]
        gg = tl.arange(0, GROUP_POW2)[:, None]
        dd = tl.arange(0, DIM_PAD)[None, :]
        tl.store(out_ptr + out_offset + gg * o_s_head + dd, merged.to(out_ptr.dtype.element_ty),
                 mask=(gg < GROUP) & (dd < HEAD_DIM))
