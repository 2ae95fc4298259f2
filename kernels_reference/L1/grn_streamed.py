"""GRN's streamed form: the reduction and the apply pass in one persistent launch, x read from HBM once.

The two-launch forms of grn.py read every image twice from HBM (the reduction, then the apply
pass, by which time the batch has left L2) and pay two or three launches; at one image the launches
and their latency are most of the time (one 56 x 56 x 384 image: 14.2 us against Inductor's 10.4 on
an H100, 2026-12-07). Here a grid of persistent programs walks one schedule of work items, stage by
stage: stage ``s`` holds the reduction items of image ``s`` (a pixel split x a channel block each)
and the apply tiles of image ``s - LAG``. An apply tile reads an image whose reduction finished a
few images earlier, so its x comes from L2 (``LAG`` images, 2.4 MB each at stage 1, stay well
inside the 50 MB of an H100's L2).

How the programs agree without a second launch, through int32 counters that outlive it (no fill
before a launch or a CUDA-graph replay):

- the launch's epoch: every program reads it first; the program that finishes last (a count of
  finished programs, zeroed again) advances it, so each launch has its own value;
- a reduction item stores its partial sums, then counts itself in its image's tickets (a CTA
  barrier, then an acq_rel atomic at GPU scope, as the paged decode's fused merge does); the item
  that counts last zeroes the tickets, sums the image's partials into ``1 + weight * Nx`` factors,
  stores them and sets the image's ready flag to the epoch + 1 (barrier, release);
- an apply tile issues its x load, polls the ready flag with acquire loads until it holds this
  launch's value, reads the factors at L2 (``.cg``) and writes its tile. Flags are never lowered:
  the next launch waits for a higher value.

No deadlock as long as every program is resident at once: programs take items in schedule order
(item ``p``, ``p + grid``, ...), and an apply tile only waits for items earlier in the schedule,
so the earliest unfinished item can always run. The grid is therefore at most the SMs times the
programs that fit on one SM, read from the compiled kernel of exactly the launch's constexprs and
argument specialization (the split count changes the factor tile and with it the registers: on an
H100 on 2026-12-07 a batch of 32 stage-1 maps hung when two programs an SM were taken from another
split count's kernel, docs/perf/h100-2026-12-07c.md). In Triton's interpreter programs run one
after another, so the launch there is a single program, which meets every wait in order.

No atomics on data: the factors are summed by one program in a fixed order, the same bits on every
run whatever the grid.
"""
import os
from typing import NamedTuple

import torch

from ..ops.launch_counters import zeroed_counters
from ..triton_rows import autotune_here, cached_resident_programs, sm_count, whole_tiles

try:
    import triton
    import triton.language as tl
except ImportError:  # GRN's native path still works without Triton
    triton = None


class StreamTiles(NamedTuple):
    """One streamed launch: the reduction's pixel splits and tile, the apply tile, the warps, how many
    images the apply pass trails the reduction by, and the programs wanted per SM."""
    splits: int
    reduce_rows: int
    reduce_channels: int
    apply_rows: int
    apply_channels: int
    warps: int = 8
    lag: int = 2
    programs_per_sm: int = 2


# The factor sums hold an image's [splits, channels] partials in registers at once.
PARTIALS_TILE = 16384
# Tiles of 64 x 64 on 4 warps (8 KB of bf16, two in flight a reduction step): one 56 x 56 x 384
# image in 10.92 us on an H100 on 2026-12-07, against 14.37 with the first choice, 64 x 128 on 8
# warps (158 registers a thread there, so one program an SM; grn_variants,
# docs/perf/h100-2026-12-07c.md).
GPU_TILES = StreamTiles(splits=0, reduce_rows=64, reduce_channels=64, apply_rows=64, apply_channels=64, warps=4)
# The counters: the epoch at 0 and the finished programs at 8, then each image's 32 ints (128 B)
# from 32 * (image + 1): its reduction tickets at +0, its ready flag at +8, each in its own 32-byte
# sector, so programs polling one image's flag do not share a sector with tickets being counted.
COUNTER_STRIDE = 32


def max_splits(pixels: int, channels: int) -> int:
    """Splits of an image whose partials the factor sum holds at once, none under 32 pixels."""
    return max(1, min(PARTIALS_TILE // triton.next_power_of_2(channels), pixels // 32))


def planned_splits(batch: int, pixels: int, channels: int, reduce_channels: int, lag: int, programs: int) -> int:
    """Pixel splits so that the reduction items of the images in flight at once (``lag + 1``, or
    the batch) about fill the grid."""
    channel_blocks = triton.cdiv(channels, reduce_channels)
    return max(1, min(max_splits(pixels, channels), triton.cdiv(programs, channel_blocks * min(batch, lag + 1))))


def whole_row_tile(pixels: int, channels: int) -> tuple:
    """(rows, width) of the interpreter's tiles, in every GRN form: it pays per program and op, not
    per element, so whole channel rows and as many pixels as 16384 elements allow."""
    width = triton.next_power_of_2(channels)
    return max(1, min(triton.next_power_of_2(pixels), 16384 // width)), width


def interpreter_tiles(pixels: int, channels: int) -> StreamTiles:
    """Whole-row tiles, one split (unless ``FK_GPU_TILES=1`` asks for the GPU's tiles)."""
    rows, width = whole_row_tile(pixels, channels)
    return StreamTiles(1, rows, width, rows, width, warps=4, lag=1)


def all_sms_available() -> bool:
    """Whether this process may place programs on every SM the device reports, as the persistent
    grid assumes. Not under an MPS client limited to a share of the SMs
    (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` below 100): there a full grid could never be resident at
    once, and its programs would wait forever on flags of programs never started."""
    share = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "").strip()
    try:
        return not share or float(share) >= 100
    except ValueError:  # unreadable: assume the limit is real
        return False


def specialization(args) -> tuple:
    """What Triton compiles a separate kernel for besides the constexprs: each tensor's dtype and
    16-byte alignment, each integer's being 1 or a multiple of 16. Two launches that differ here may
    differ in registers, and so in the programs that fit on an SM."""
    return tuple((a.dtype, a.data_ptr() % 16 == 0) if isinstance(a, torch.Tensor)
                 else (a == 1, a % 16 == 0) if isinstance(a, int) else type(a).__name__ for a in args)


def grn_streamed(grn, x: torch.Tensor, out: torch.Tensor, tiles: "StreamTiles | None" = None) -> torch.Tensor:
    batch, height, width, channels = x.shape
    pixels = height * width
    on_gpu = autotune_here(x)
    if tiles is None:
        tiles = GPU_TILES if on_gpu or not whole_tiles() else interpreter_tiles(pixels, channels)
    wanted = sm_count(x.device) * tiles.programs_per_sm if on_gpu else 1  # the interpreter: one program (above)
    splits = tiles.splits or planned_splits(batch, pixels, channels, tiles.reduce_channels, tiles.lag, wanted)
    splits = min(splits, max_splits(pixels, channels))
    rows_per_split = triton.cdiv(pixels, splits)
    splits = triton.cdiv(pixels, rows_per_split)  # whole splits, none empty
    partial = torch.empty((batch, splits, channels), dtype=torch.float32, device=x.device)
    factors = torch.empty((batch, channels), dtype=torch.float32, device=x.device)
    counters = zeroed_counters(x.device, COUNTER_STRIDE * (batch + 1), "grn_streamed")
    apply_tiles = triton.cdiv(pixels, tiles.apply_rows) * triton.cdiv(channels, tiles.apply_channels)
    items = (batch + tiles.lag) * (splits * triton.cdiv(channels, tiles.reduce_channels) + apply_tiles)
    args = (x, partial, factors, counters, grn.weight, grn.bias, out, batch, pixels, channels, splits, rows_per_split,
            grn.eps, tiles.lag)
    meta = dict(SPLITS_BLOCK=triton.next_power_of_2(splits), CHANNELS_BLOCK=triton.next_power_of_2(channels),
                RED_R=tiles.reduce_rows, RED_C=tiles.reduce_channels, APP_R=tiles.apply_rows,
                APP_C=tiles.apply_channels, STRIDE=COUNTER_STRIDE, num_warps=tiles.warps)
    programs = min(wanted, items)
    if on_gpu:  # never more programs than fit at once: the compiled kernel of exactly this launch
        key = ("grn_streamed", x.device, specialization(args), tuple(sorted(meta.items())))
        resident = cached_resident_programs(key, lambda: _grn_streamed_kernel.warmup(*args, grid=(1,), **meta),
                                            x.device)
        programs = min(programs, sm_count(x.device) * (resident or 1))
    _grn_streamed_kernel[(programs,)](*args, **meta)
    return out


if triton is not None:

    @triton.jit
    def _sum_squares(base, first, last, channels, cols, col_ok, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                     PAIRS: tl.constexpr):
        """Sums of squares of the channels ``cols`` over the pixels [first, last) of one image at
        ``base``; ``PAIRS`` loads two row tiles a step, both in flight before either is summed."""
        acc = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float32)
        step: tl.constexpr = 2 * BLOCK_R if PAIRS else BLOCK_R
        for start in range(first, last, step):
            rows = start + tl.arange(0, BLOCK_R)
            ok = (rows < last)[:, None] & col_ok[None, :]
            v = tl.load(base + rows.to(tl.int64)[:, None] * channels + cols[None, :], mask=ok, other=0.0)
            if PAIRS:
                more = rows + BLOCK_R
                ok2 = (more < last)[:, None] & col_ok[None, :]
                v2 = tl.load(base + more.to(tl.int64)[:, None] * channels + cols[None, :], mask=ok2, other=0.0)
                v2 = v2.to(tl.float32)
                acc += v2 * v2
            v = v.to(tl.float32)
            acc += v * v
        return tl.sum(acc, axis=0)

    @triton.jit
    def _image_factors_at_once(stats, w_ptr, channels, splits, eps, SPLITS_BLOCK: tl.constexpr,
                               CHANNELS_BLOCK: tl.constexpr):
        """(channels, ``1 + weight * Nx``) of one image from all its partials in one load, read at
        L2: other programs wrote them in this launch."""
        s = tl.arange(0, SPLITS_BLOCK)
        cols = tl.arange(0, CHANNELS_BLOCK)
        ok = (s < splits)[:, None] & (cols < channels)[None, :]
        sums = tl.sum(tl.load(stats + s[:, None] * channels + cols[None, :], mask=ok, other=0.0,
                              cache_modifier=".cg"), axis=0)
        norms = tl.sqrt(sums)  # 0 on the padded channels
        inv_mean = 1.0 / (tl.sum(norms, axis=0) / channels + eps)
        w = tl.load(w_ptr + cols, mask=cols < channels, other=0.0).to(tl.float32)
        return cols, 1.0 + w * norms * inv_mean

    @triton.jit
    def _reduce_item(x_ptr, partial_ptr, factor_ptr, counter, ready, w_ptr, image, item, pixels, channels, splits,
                     rows_per_split, eps, channel_blocks, SPLITS_BLOCK: tl.constexpr, CHANNELS_BLOCK: tl.constexpr,
                     RED_R: tl.constexpr, RED_C: tl.constexpr):
        split = item // channel_blocks
        cols = (item % channel_blocks) * RED_C + tl.arange(0, RED_C)
        col_ok = cols < channels
        first = split * rows_per_split
        sums = _sum_squares(x_ptr + image.to(tl.int64) * pixels * channels, first,
                            tl.minimum(first + rows_per_split, pixels), channels, cols, col_ok, RED_R, RED_C, True)
        image_partials = partial_ptr + image.to(tl.int64) * splits * channels  # int64: any batch
        tl.store(image_partials + split * channels + cols, sums, mask=col_ok)
        tl.debug_barrier()  # every thread's partials stored before the count is released
        if tl.atomic_add(counter, 1, sem="acq_rel") == splits * channel_blocks - 1:
            tl.atomic_xchg(counter, 0)  # zero again for the next launch
            cols_all, factor = _image_factors_at_once(image_partials, w_ptr, channels, splits, eps, SPLITS_BLOCK,
                                                      CHANNELS_BLOCK)
            tl.store(factor_ptr + image.to(tl.int64) * channels + cols_all, factor, mask=cols_all < channels)
            tl.debug_barrier()
            tl.atomic_xchg(counter + 8, ready, sem="release")

    @triton.jit
    def _apply_item(x_ptr, factor_ptr, counter, ready, b_ptr, out_ptr, image, item, pixels, channels, channel_blocks,
                    APP_R: tl.constexpr, APP_C: tl.constexpr):
        rows = (item // channel_blocks) * APP_R + tl.arange(0, APP_R)
        cols = (item % channel_blocks) * APP_C + tl.arange(0, APP_C)
        col_ok = cols < channels
        ok = (rows < pixels)[:, None] & col_ok[None, :]
        offsets = image.to(tl.int64) * pixels * channels + rows.to(tl.int64)[:, None] * channels + cols[None, :]
        x = tl.load(x_ptr + offsets, mask=ok, other=0.0)  # in flight while the flag is polled
        # an add of 0 with acquire semantics: Triton issues it as one ld.acquire.gpu (no atomic queued
        # on the line), by one thread, and shares the value with the program
        while tl.atomic_add(counter + 8, 0, sem="acquire") != ready:
            pass
        factor = tl.load(factor_ptr + image.to(tl.int64) * channels + cols, mask=col_ok, other=0.0,
                         cache_modifier=".cg")
        b = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        y = x.to(tl.float32) * factor[None, :] + b[None, :]
        tl.store(out_ptr + offsets, y.to(out_ptr.dtype.element_ty), mask=ok)

    @triton.jit
    def _grn_streamed_kernel(x_ptr, partial_ptr, factor_ptr, counters_ptr, w_ptr, b_ptr, out_ptr, batch, pixels,
                             channels, splits, rows_per_split, eps, lag,
                             SPLITS_BLOCK: tl.constexpr, CHANNELS_BLOCK: tl.constexpr, RED_R: tl.constexpr,
                             RED_C: tl.constexpr, APP_R: tl.constexpr, APP_C: tl.constexpr, STRIDE: tl.constexpr):
        reduce_blocks = tl.cdiv(channels, RED_C)
        reduce_items = splits * reduce_blocks
        apply_blocks = tl.cdiv(channels, APP_C)
        apply_items = tl.cdiv(pixels, APP_R) * apply_blocks
        stage_items = reduce_items + apply_items
        ready = tl.atomic_add(counters_ptr, 0, sem="acquire") + 1  # this launch's epoch + 1
        for item in range(tl.program_id(0), (batch + lag) * stage_items, tl.num_programs(0)):
            stage = item // stage_items
            slot = item % stage_items
            if slot < reduce_items:
                if stage < batch:
                    _reduce_item(x_ptr, partial_ptr, factor_ptr, counters_ptr + STRIDE * (stage + 1), ready, w_ptr,
                                 stage, slot, pixels, channels, splits, rows_per_split, eps, reduce_blocks,
                                 SPLITS_BLOCK, CHANNELS_BLOCK, RED_R, RED_C)
            elif stage >= lag:
                _apply_item(x_ptr, factor_ptr, counters_ptr + STRIDE * (stage - lag + 1), ready, b_ptr, out_ptr,
                            stage - lag, slot - reduce_items, pixels, channels, apply_blocks, APP_R, APP_C)
        tl.debug_barrier()  # every thread done with its reads of the epoch before it can advance
        if tl.atomic_add(counters_ptr + 8, 1, sem="acq_rel") == tl.num_programs(0) - 1:  # the last program
            tl.atomic_xchg(counters_ptr + 8, 0)
            tl.atomic_add(counters_ptr, 1, sem="release")
