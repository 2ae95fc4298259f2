"""Global Response Normalization (GRN), the op ConvNeXt-V2 adds inside each block's MLP.

timm's ``GlobalResponseNorm(dim, eps=1e-6, channels_last=True)`` and Hugging Face's
``ConvNextV2GRN`` (the same module; its eps is a fixed 1e-6) run on the MLP's hidden features
after GELU, ``[B, H, W, 4 * C]`` channels-last, and compute per image

    Gx[c] = ||x[:, :, c]||_2 over (H, W)           (one L2 norm per channel)
    Nx[c] = Gx[c] / (mean over channels of Gx + eps) (eps added to the mean, outside any sqrt)
    out   = x + bias + weight * (x * Nx)

timm writes the last line as ``addcmul(bias, weight * Nx + 1, x)``, the same value. Parameters are
``weight`` and ``bias`` of shape ``[1, 1, 1, dim]`` (``[1, dim, 1, 1]`` channels-first), as in timm
and in current Hugging Face checkpoints, so their state dicts load strictly; the original
ConvNeXt-V2 release names them ``gamma`` / ``beta`` with the same shapes (timm's checkpoint filter
renames them).

Numerics: half types compute in float32 (the norms, their mean, the epilogue) and round once;
float64 stays float64, which makes ``forward_native`` the correctness truth. timm and HF on half
types round the norm and its mean to the activation dtype on the way; one rounding is stricter.

The fast path on CUDA (channels-last, half or float32) is a reduction launch and an apply launch.
The first sums squares: a program per (image, pixel range, channel block) reduces its range into a
float32 ``partial[B, splits, C]`` with plain stores, the pixels split so that the launch has a few
programs per SM even for one image. The second writes ``x * (1 + weight * Nx) + bias`` for a tile
per program. The factors ``1 + weight * Nx`` need the image's mean norm over all channels; where
they are computed is the form (below): for small maps every apply program sums its image's
partials again; for large maps a factor launch between the two writes them, after a reduction
planned to fill one wave of the GPU. No atomics on data: the same bits on every run of one
configuration, in every form. The other tile shapes are autotuned per (channels, pixel-count
bucket). Channels-first inputs take the native path.

What the timings say: an earlier design (atomics into ``[B, C]``, a factor launch, an apply
launch) and the recompute form both timed at 0.22-0.29 of ``torch.compile(forward_native)`` on
ConvNeXt-V2-Tiny's batch-32 stages (2026-12-05), mostly a copy: the task handed the op NCHW
features, which ``x.contiguous()`` rewrote on every call. With contiguous features (as an MLP's fc1
writes them), on an H100 on 2026-12-06 (docs/perf/h100-2026-12-06h.md): stages 2-4 at batch 32 at
0.98-1.39 of Inductor, stage 1 at 0.86 (the factor launch: 0.94), one stage-1 image at 0.63; on
2026-12-07 with the one-wave reduction (docs/perf/h100-2026-12-07d.md): stage 1 at batch 32 at
0.911 in the peer benchmark, one stage-1 image at 1.022, all eight cases at geomean 1.051.
"""
import functools
from typing import NamedTuple, Optional

import torch
from torch import nn

from ..dispatch import compute_dtype, use_fast_path
from ..records import RecordsInit
from ..triton_rows import autotune, autotune_here, cached_resident_programs, size_class, sm_count, splits_in_one_wave

try:
    import triton
    import triton.language as tl
except ImportError:  # the native path still works without Triton
    triton = None


class GlobalResponseNorm(RecordsInit, nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6, channels_last: bool = True):
        super().__init__()
        self.dim, self.eps, self.channels_last = dim, eps, channels_last
        shape = (1, 1, 1, dim) if channels_last else (1, dim, 1, 1)
        self.weight = nn.Parameter(torch.zeros(shape))
        self.bias = nn.Parameter(torch.zeros(shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [B, H, W, dim] (channels-last) or [B, dim, H, W] -> the same shape and dtype."""
        if triton is not None and self.channels_last and use_fast_path(x):
            return self.forward_triton(x)
        return self.forward_native(x)

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        spatial, channel = ((1, 2), -1) if self.channels_last else ((2, 3), 1)
        xf = x.to(compute_dtype(x.dtype))
        gx = torch.linalg.vector_norm(xf, ord=2, dim=spatial, keepdim=True)
        nx = gx / (gx.mean(dim=channel, keepdim=True) + self.eps)
        out = xf + self.bias.to(xf.dtype) + self.weight.to(xf.dtype) * (xf * nx)
        return out.to(x.dtype)

    def forward_triton(self, x: torch.Tensor) -> torch.Tensor:
        return grn_channels_last(self, x)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}, channels_last={self.channels_last}"


class Tiles(NamedTuple):
    """One launch configuration: the pixel splits of the reduction, the tile of each launch, and
    the channel chunk in which the apply programs sum the partials for the mean."""
    splits: int
    reduce_rows: int
    reduce_channels: int
    apply_rows: int
    apply_channels: int
    warps: int
    stats_channels: int
    apply_warps: Optional[int] = None  # None: ``warps``


# Programs a reduction aims for per SM: enough to hide memory latency, few enough that each still
# streams a long contiguous pixel range.
REDUCE_PROGRAMS_PER_SM = 6
# The partials of one image that every apply program reads, in floats (16 KB): more splits would
# make those L2 reads rival the tile the program moves. (The plan of the recompute form, which
# takes the maps under LARGE_MAP_PIXELS; the factor launch plans by ``one_wave_splits``.)
PARTIALS_PER_IMAGE = 4096
MAX_SPLITS = 32  # the apply programs hold [splits, channels] partial tiles in registers
NOMINAL_CHANNELS = 64  # the channel block the split count is planned for
STATS_TILE = 4096  # [splits, channel chunk] partials summed at once
# How the apply programs get each (image, channel)'s factor ``1 + weight * Nx``, which needs the
# image's mean norm over all channels, so every reduction program of the image first:
#   "recompute"      each apply program sums every split's partials of its image (stage 1 at batch
#                    32: 7.7 KB of L2 reads a program, 72 MB over the launch);
#   "factor-launch"  a third launch, a program per image, writes [B, C] factors between the two.
# On an H100 (2026-12-07, grn_variants, every ConvNeXt-V2-tiny stage at batch 1 and 32 against
# Inductor) recompute's geomean was 1.016 (min 0.707, one 56 x 56 x 384 image: 15.0 us against
# 10.6), the factor launch's 0.929 (min 0.691): faster only at stage 1 at batch 32 (91.1 against
# 96.0 us, as on 2026-12-06), slower at every other shape. A third form, the reduction's last
# program per image writing the factors after an atomic ticket (two launches, no re-reads), was
# slower still (geomean 0.915, min 0.702) and is gone (21bd60d has it).
# A third form, one persistent launch that reduced an image and applied it a few images later from
# L2, counters between its programs instead of a second launch (e02fb8e has it, grn_streamed.py),
# took one 56 x 56 x 384 image in 10.92 us against the recompute form's 15.19 and Inductor's 10.74
# (H100, 2026-12-07, docs/perf/h100-2026-12-07c.md) and was slower at every batch of 32 (stage 1:
# 107 us at best against 94.8). The factor launch beat recompute at stage 1 at batch 32 in every
# H100 run (Inductor / form 0.882-0.940 against 0.839-0.879, five runs on 2026-12-06 and 07) and
# lost at every other shape. With its reduction planned for one wave (``ONE_WAVE_REDUCE``, below)
# it took one stage-1 image in 9.90 us at 8 splits against the persistent form's 11.16 and
# Inductor's 9.55, and the batch of 32 in 87.3 us against 91.5 before (H100, 2026-12-07,
# docs/perf/h100-2026-12-07d.md); the persistent form went. ``FORM = "by-shape"`` (shipped): maps
# of at least ``LARGE_MAP_PIXELS`` take the factor launch, smaller maps recompute.
FORMS = ("recompute", "factor-launch")
FORM = "by-shape"
LARGE_MAP_PIXELS = 56 * 56
# The apply launch's programs in reverse order (last image and channel block first, what the
# reduction read last and L2 most likely still holds) moved no case by more than 1% on an H100 on
# 2026-12-07 (stage 1 at batch 32 90.76 against 90.98 us, stage 2 45.57 against 45.82,
# docs/perf/h100-2026-12-07d.md); aa70aef has the setting.
# The reduction's programs each take a channel block of a pixel range, so a pixel's row of channels
# is read in pieces by several programs. A reduction that streamed whole pixel rows instead (a
# program per image and pixel range, the channels viewed as 3 rows of 128 or 256) was slower on an
# H100 on 2026-12-07 (grn_variants, docs/perf/h100-2026-12-07b.md): stage 1 at batch 32 97.7 us
# against 91.9 with the factor launch and 134.5 against 95.8 with recompute, one stage-1 image
# 20.1 against 14.2; aaf2495 has it.


def grn_channels_last(grn: GlobalResponseNorm, x: torch.Tensor, config: Optional[Tiles] = None,
                      form: Optional[str] = None) -> torch.Tensor:
    """The launches on a channels-last ``x``; ``config`` is only given by tests that run the GPU's
    tiling in the interpreter and by benchmarks/grn_variants.py (a real GPU autotunes, the
    interpreter takes ``interpreter_tiles``), ``form`` (default ``FORM``) by those that compare forms."""
    form = FORM if form is None else form
    if form not in FORMS + ("by-shape",):
        raise ValueError(f"GRN form {form!r} is not one of {FORMS + ('by-shape',)}")
    if x.dim() != 4 or x.shape[-1] != grn.dim:
        raise ValueError(f"GlobalResponseNorm({grn.dim}) expects [B, H, W, {grn.dim}], got {tuple(x.shape)}")
    x = x.contiguous()  # the MLP's fc1 + GELU output already is
    batch, height, width, channels = x.shape
    pixels = height * width
    if form == "by-shape":
        large = pixels >= LARGE_MAP_PIXELS
        form = "factor-launch" if large else "recompute"
    out = torch.empty_like(x)
    if x.numel() == 0:
        return out
    tuned = config is None and autotune_here(x)
    one_wave = tuned and form == "factor-launch"  # the reduction planned, not autotuned (ONE_WAVE_REDUCE)
    if one_wave:
        splits = one_wave_splits(batch, pixels, channels, ONE_WAVE_REDUCE[1], sm_count(x.device),
                                 reduction_residency(x, *ONE_WAVE_REDUCE))
    elif tuned:
        splits = pixel_splits(batch, pixels, channels, sm_count(x.device))
    else:
        config = config or interpreter_tiles(x)
        splits = config.splits
    splits, rows_per_split = whole_splits(pixels, splits)
    partial = torch.empty((batch, splits, channels), dtype=torch.float32, device=x.device)
    splits_block = triton.next_power_of_2(splits)
    stats_channels = config.stats_channels if config is not None else stats_chunk(splits, channels)
    stats_consts = dict(SPLITS_BLOCK=splits_block, STATS_BLOCK=stats_channels)
    # What the apply programs read: the partials, or [B, C] factors written before them.
    factors = partial if form == "recompute" else torch.empty((batch, channels), dtype=torch.float32, device=x.device)
    size_cls = size_class(batch * pixels)
    reduce_args = (x, partial, pixels, channels, splits, rows_per_split, size_cls)
    apply_args = (x, factors, grn.weight, grn.bias, out, pixels, channels, splits, grn.eps, size_cls)
    apply_consts = dict(stats_consts, FACTORS=form != "recompute")
    if one_wave:
        block_r, block_c, warps = ONE_WAVE_REDUCE
        _grn_sumsq_kernel[(batch * splits, triton.cdiv(channels, block_c))](
            *reduce_args, BLOCK_R=block_r, BLOCK_C=block_c, num_warps=warps)
    elif tuned:
        _tuned_sumsq()[lambda meta: (batch * splits, triton.cdiv(channels, meta["BLOCK_C"]))](*reduce_args)
    else:
        _grn_sumsq_kernel[(batch * splits, triton.cdiv(channels, config.reduce_channels))](
            *reduce_args, BLOCK_R=config.reduce_rows, BLOCK_C=config.reduce_channels, num_warps=config.warps)
    if form == "factor-launch":
        _grn_factor_kernel[(batch,)](partial, grn.weight, factors, channels, splits, grn.eps, **stats_consts)
    if tuned:
        apply_grid = lambda meta: (batch * triton.cdiv(pixels, meta["BLOCK_R"]),  # noqa: E731
                                   triton.cdiv(channels, meta["BLOCK_C"]))
        _tuned_apply()[apply_grid](*apply_args, **apply_consts)
    else:
        grid = (batch * triton.cdiv(pixels, config.apply_rows), triton.cdiv(channels, config.apply_channels))
        _grn_apply_kernel[grid](*apply_args, **apply_consts, BLOCK_R=config.apply_rows, BLOCK_C=config.apply_channels,
                                num_warps=config.apply_warps or config.warps)
    return out


def stats_chunk(splits: int, channels: int) -> int:
    """The channels whose [splits, channels] partials are summed at once: ``STATS_TILE`` floats."""
    return max(1, min(triton.next_power_of_2(channels), STATS_TILE // triton.next_power_of_2(splits)))


def pixel_splits(batch: int, pixels: int, channels: int, sm_count: int) -> int:
    """How many programs share an image's pixels in the reduction: enough for a few programs an
    SM (one 7 x 7 x 3072 stage-4 map has 48 channel blocks, one 56 x 56 x 384 map only 6), capped
    so that no split is shorter than 32 pixels and the partials stay small for the apply programs."""
    programs = batch * triton.cdiv(channels, NOMINAL_CHANNELS)
    wanted = triton.cdiv(REDUCE_PROGRAMS_PER_SM * sm_count, programs)
    cap = min(MAX_SPLITS, triton.cdiv(pixels, 32), max(1, PARTIALS_PER_IMAGE // channels))
    return max(1, min(wanted, cap))


def whole_splits(pixels: int, splits: int) -> tuple:
    """(splits, pixels per split) with whole splits only: the last takes the remainder, none is empty."""
    rows_per_split = triton.cdiv(pixels, splits)
    return triton.cdiv(pixels, rows_per_split), rows_per_split


def one_wave_splits(batch: int, pixels: int, channels: int, block_c: int, sms: int, resident: Optional[int]) -> int:
    """The factor launch's pixel splits: as many as keep the reduction within one wave of resident
    programs (``resident`` an SM), at least one and at most ``ONE_WAVE_MAX_SPLITS``. A reduction of
    1.2 waves runs its last 0.2 on a few SMs while the rest idle; each program here streams the
    same bytes, so that tail costs nearly a whole second wave."""
    pairs = batch * triton.cdiv(channels, block_c)  # (image, channel block) pairs, a program each per split
    return splits_in_one_wave(pairs, sms, resident or 1, min(ONE_WAVE_MAX_SPLITS, triton.cdiv(pixels, 32)))


def reduction_residency(x: torch.Tensor, block_r: int, block_c: int, warps: int) -> Optional[int]:
    """Reduction programs of this tile that fit an SM at once, from its compiled kernel (compiled
    here, once per device, dtype and tile). A speed plan only: a grid past it is correct, just slower."""
    partial = torch.empty((1, 2, x.shape[-1]), dtype=torch.float32, device=x.device)
    compile_kernel = lambda: _grn_sumsq_kernel.warmup(  # noqa: E731
        x, partial, x.shape[1] * x.shape[2], x.shape[-1], 2, 32, 0, BLOCK_R=block_r, BLOCK_C=block_c,
        num_warps=warps, grid=(1,))
    return cached_resident_programs(("grn_reduce", x.dtype, block_r, block_c, warps), compile_kernel, x.device)


def interpreter_tiles(x: torch.Tensor) -> Tiles:
    """The interpreter pays per program and op, not per element: whole channel rows, as many pixels
    as 16384 elements allow, no split."""
    block_c = triton.next_power_of_2(x.shape[-1])
    block_r = max(1, min(triton.next_power_of_2(x.shape[1] * x.shape[2]), 16384 // block_c))
    return Tiles(1, block_r, block_c, block_r, block_c, 4, block_c)


# Reduction tiles load whole 128-1024 B row segments (64-512 bf16 channels); apply tiles range from
# narrow-and-tall (one-image stage 4 has 49 pixels) to wide. The last three move 32 KB a loop step:
# the reduction of stage 1 at batch 32 ran at 0.64 of copy bandwidth with the first five (40.2 of
# 94.1 us; the apply launch 0.95; H100, 2026-12-06, docs/perf/h100-2026-12-06g.md), where each
# program walks 628 pixels in 4-8 KB steps. Timed later that day (h100-2026-12-06h.md): at stage 1
# batch 32 neither form's fastest reduction used them; for one stage-1 image (128, 128, 8) was the
# fastest with the factor launch. The autotuner picks among all eight.
_REDUCE_CONFIGS = [(32, 64, 4), (64, 64, 4), (32, 128, 4), (64, 128, 8), (16, 256, 4),
                   (64, 256, 8), (128, 128, 8), (32, 512, 8)]
_APPLY_CONFIGS = [(16, 128, 4), (32, 128, 4), (64, 128, 8), (32, 256, 8), (128, 64, 8)]
# The factor launch's reduction (every map of at least LARGE_MAP_PIXELS) is not autotuned: its split count must be
# planned for the tile's residency (``one_wave_splits``), and the autotuner times every tile at one
# split count. At stage 1 at batch 32 on an H100 on 2026-12-07 (grn_variants --splits, ten tiles x
# 1-11 splits, docs/perf/h100-2026-12-07d.md) every tile was fastest at 0.9-0.97 waves and slower
# past one (64 x 64 on 4 warps: 91.1 us at 0.97 waves, 97.6 at 1.29); Inductor's own choice, 64
# channels x 64 pixels on 16 warps, at 2 splits (0.97 waves) was the fastest of all: 87.4 us against
# the autotuned reduction's 91.5 (5 splits) and Inductor's 83.5. Two load options, two row
# tiles in flight a step and evict-first loads (Inductor's), moved no row by more than 1%.
ONE_WAVE_REDUCE = (64, 64, 16)
# Splits past 8 lost for one stage-1 image (the same run: 4 / 8 / 16 splits 10.95 / 9.90 / 11.56 us):
# an image's 6 channel blocks x 8 splits already start every program at once, and more only add
# partials and shorter ranges.
ONE_WAVE_MAX_SPLITS = 8


@functools.lru_cache(maxsize=None)
def _tuned_sumsq():
    configs = [triton.Config({"BLOCK_R": r, "BLOCK_C": c}, num_warps=w) for r, c, w in _REDUCE_CONFIGS]
    return autotune(configs=configs, key=["channels", "size_cls"])(_grn_sumsq_kernel)


@functools.lru_cache(maxsize=None)
def _tuned_apply():
    configs = [triton.Config({"BLOCK_R": r, "BLOCK_C": c}, num_warps=w) for r, c, w in _APPLY_CONFIGS]
    return autotune(configs=configs, key=["channels", "size_cls", "FACTORS"])(_grn_apply_kernel)


if triton is not None:

    @triton.jit(do_not_specialize=["size_cls"])
    def _grn_sumsq_kernel(x_ptr, partial_ptr, pixels, channels, splits, rows_per_split,
                          size_cls,  # only an autotune key (the pixel-count bucket)
                          BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
        image = tl.program_id(0) // splits
        split = tl.program_id(0) % splits
        cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        col_ok = cols < channels
        base = x_ptr + image.to(tl.int64) * pixels * channels
        first = split * rows_per_split
        last = tl.minimum(first + rows_per_split, pixels)
        acc = tl.zeros([BLOCK_R, BLOCK_C], dtype=tl.float32)
        for start in range(first, last, BLOCK_R):
            rows = start + tl.arange(0, BLOCK_R)
            ok = (rows < last)[:, None] & col_ok[None, :]
            v = tl.load(base + rows.to(tl.int64)[:, None] * channels + cols[None, :], mask=ok, other=0.0)
            v = v.to(tl.float32)
            acc += v * v
        tl.store(partial_ptr + (image * splits + split) * channels + cols, tl.sum(acc, axis=0), mask=col_ok)

    @triton.jit
    def _summed_partials(stats_ptr, splits, channels, cols, SPLITS_BLOCK: tl.constexpr):
        """Sums of squares of the channels ``cols``: the image's splits added up."""
        s = tl.arange(0, SPLITS_BLOCK)
        ok = (s < splits)[:, None] & (cols < channels)[None, :]
        return tl.sum(tl.load(stats_ptr + s[:, None] * channels + cols[None, :], mask=ok, other=0.0), axis=0)

    @triton.jit
    def _inverse_mean_norm(stats, channels, splits, eps, SPLITS_BLOCK: tl.constexpr, STATS_BLOCK: tl.constexpr):
        """1 / (the mean over channels of the L2 norms + eps) from one image's partials."""
        norms = tl.zeros([STATS_BLOCK], dtype=tl.float32)
        for start in range(0, channels, STATS_BLOCK):
            norms += tl.sqrt(_summed_partials(stats, splits, channels, start + tl.arange(0, STATS_BLOCK), SPLITS_BLOCK))
        return 1.0 / (tl.sum(norms, axis=0) / channels + eps)

    @triton.jit
    def _image_factors(stats, w_ptr, channels, splits, inv_mean, cols, SPLITS_BLOCK: tl.constexpr):
        """``1 + weight * Nx`` of the channels ``cols`` from one image's partials."""
        nx = tl.sqrt(_summed_partials(stats, splits, channels, cols, SPLITS_BLOCK)) * inv_mean
        return 1.0 + tl.load(w_ptr + cols, mask=cols < channels, other=0.0).to(tl.float32) * nx

    @triton.jit
    def _grn_factor_kernel(partial_ptr, w_ptr, factor_ptr, channels, splits, eps,
                           SPLITS_BLOCK: tl.constexpr, STATS_BLOCK: tl.constexpr):
        image = tl.program_id(0)
        stats = partial_ptr + image * splits * channels
        inv_mean = _inverse_mean_norm(stats, channels, splits, eps, SPLITS_BLOCK, STATS_BLOCK)
        for start in range(0, channels, STATS_BLOCK):
            cols = start + tl.arange(0, STATS_BLOCK)
            factor = _image_factors(stats, w_ptr, channels, splits, inv_mean, cols, SPLITS_BLOCK)
            tl.store(factor_ptr + image * channels + cols, factor, mask=cols < channels)

    @triton.jit(do_not_specialize=["size_cls"])
    def _grn_apply_kernel(x_ptr, stats_ptr, w_ptr, b_ptr, out_ptr, pixels, channels, splits, eps,
                          size_cls,  # only an autotune key (the pixel-count bucket)
                          SPLITS_BLOCK: tl.constexpr, STATS_BLOCK: tl.constexpr,
                          FACTORS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
        tile = tl.program_id(0)
        channel_block = tl.program_id(1)
        row_blocks = tl.cdiv(pixels, BLOCK_R)
        image = tile // row_blocks
        cols = channel_block * BLOCK_C + tl.arange(0, BLOCK_C)
        col_ok = cols < channels
        rows = (tile % row_blocks) * BLOCK_R + tl.arange(0, BLOCK_R)
        ok = (rows < pixels)[:, None] & col_ok[None, :]
        offsets = image.to(tl.int64) * pixels * channels + rows.to(tl.int64)[:, None] * channels + cols[None, :]
        # the tile's load is issued first and read last: its memory latency passes while the factors
        # are summed from the partials (one image's programs are latency-bound: 15 us for 2.4 MB)
        x = tl.load(x_ptr + offsets, mask=ok, other=0.0)
        if FACTORS:  # [B, C] factors written before this launch
            factor = tl.load(stats_ptr + image * channels + cols, mask=col_ok, other=0.0)
        else:  # every program of the image recomputes them from the partials
            stats = stats_ptr + image * splits * channels
            inv_mean = _inverse_mean_norm(stats, channels, splits, eps, SPLITS_BLOCK, STATS_BLOCK)
            factor = _image_factors(stats, w_ptr, channels, splits, inv_mean, cols, SPLITS_BLOCK)
        b = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        y = x.to(tl.float32) * factor[None, :] + b[None, :]
        tl.store(out_ptr + offsets, y.to(out_ptr.dtype.element_ty), mask=ok)
