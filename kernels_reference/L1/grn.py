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

The fast path on CUDA (channels-last, half or float32) is three Triton launches: the sums of
squares per (image, channel) with the spatial axis split over enough programs to fill the GPU
(float32 atomics into one ``[B, C]`` buffer), one program per image turning them into the
per-channel factor ``1 + weight * Nx`` (the mean over channels needs every channel), and an
elementwise pass ``x * factor + bias``. Channels-first inputs take the native path.
"""
import torch
from torch import nn

from ..dispatch import compute_dtype, use_fast_path
from ..records import RecordsInit
from ..triton_rows import autotune_here

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


def grn_channels_last(grn: GlobalResponseNorm, x: torch.Tensor, config=None) -> torch.Tensor:
    """The three launches on a channels-last ``x``; ``config`` (``launch_config``'s tuple) is
    only given by tests that run the GPU's tiling in the interpreter."""
    if x.dim() != 4 or x.shape[-1] != grn.dim:
        raise ValueError(f"GlobalResponseNorm({grn.dim}) expects [B, H, W, {grn.dim}], got {tuple(x.shape)}")
    x = x.contiguous()  # the MLP's fc1 + GELU output already is
    batch, height, width, channels = x.shape
    pixels = height * width
    out = torch.empty_like(x)
    if x.numel() == 0:
        return out
    sumsq = torch.zeros((batch, channels), dtype=torch.float32, device=x.device)
    factor = torch.empty((batch, channels), dtype=torch.float32, device=x.device)
    reduce_c, reduce_r, apply_c, apply_r, warps, splits = config or launch_config(x)
    rows_per_split = triton.cdiv(triton.cdiv(pixels, splits), reduce_r) * reduce_r
    splits = triton.cdiv(pixels, rows_per_split)
    _grn_sumsq_kernel[(batch * splits, triton.cdiv(channels, reduce_c))](
        x, sumsq, pixels, channels, splits, rows_per_split, BLOCK_R=reduce_r, BLOCK_C=reduce_c, num_warps=warps)
    _grn_factor_kernel[(batch,)](sumsq, grn.weight, factor, channels, grn.eps,
                                 BLOCK_C=min(1024, triton.next_power_of_2(channels)), num_warps=4)
    grid = (batch * triton.cdiv(pixels, apply_r), triton.cdiv(channels, apply_c))
    _grn_apply_kernel[grid](x, factor, grn.bias, out, pixels, channels, triton.cdiv(pixels, apply_r),
                            BLOCK_R=apply_r, BLOCK_C=apply_c, num_warps=warps)
    return out


def launch_config(x: torch.Tensor):
    """(reduction channels, reduction pixels, apply channels, apply pixels, warps, pixel splits)."""
    batch, height, width, channels = x.shape
    pixels = height * width
    if autotune_here(x):
        # 64 channels x 32 pixels a program; the pixels split so the reduction has ~4 programs an
        # SM even for one image (a 7x7 stage-4 map of one image is 49 pixels x 48 channel blocks).
        target = 4 * torch.cuda.get_device_properties(x.device).multi_processor_count
        splits = max(1, min(triton.cdiv(pixels, 32), triton.cdiv(target, batch * triton.cdiv(channels, 64))))
        return 64, 32, 128, 32, 4, splits
    # the interpreter pays per program: whole channel rows, many pixels, no split
    block_c = triton.next_power_of_2(channels)
    block_r = max(1, min(triton.next_power_of_2(pixels), 16384 // block_c))
    return block_c, block_r, block_c, block_r, 4, 1

if triton is not None:

    @triton.jit
    def _grn_sumsq_kernel(x_ptr, sumsq_ptr, pixels, channels, splits, rows_per_split,
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
        tl.atomic_add(sumsq_ptr + image * channels + cols, tl.sum(acc, axis=0), mask=col_ok)

    @triton.jit
    def _grn_factor_kernel(sumsq_ptr, w_ptr, factor_ptr, channels, eps, BLOCK_C: tl.constexpr):
        image = tl.program_id(0)
        row = sumsq_ptr + image * channels
        total = tl.zeros([BLOCK_C], dtype=tl.float32)
        for start in range(0, channels, BLOCK_C):
            cols = start + tl.arange(0, BLOCK_C)
            total += tl.sqrt(tl.load(row + cols, mask=cols < channels, other=0.0))
        inv_mean = 1.0 / (tl.sum(total, axis=0) / channels + eps)
        for start in range(0, channels, BLOCK_C):
            cols = start + tl.arange(0, BLOCK_C)
            ok = cols < channels
            nx = tl.sqrt(tl.load(row + cols, mask=ok, other=0.0)) * inv_mean
            w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
            tl.store(factor_ptr + image * channels + cols, 1.0 + w * nx, mask=ok)

    @triton.jit
    def _grn_apply_kernel(x_ptr, factor_ptr, b_ptr, out_ptr, pixels, channels, row_blocks,
                          BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
        image = tl.program_id(0) // row_blocks
        rows = (tl.program_id(0) % row_blocks) * BLOCK_R + tl.arange(0, BLOCK_R)
        cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        col_ok = cols < channels
        ok = (rows < pixels)[:, None] & col_ok[None, :]
        offsets = image.to(tl.int64) * pixels * channels + rows.to(tl.int64)[:, None] * channels + cols[None, :]
        x = tl.load(x_ptr + offsets, mask=ok, other=0.0).to(tl.float32)
        f = tl.load(factor_ptr + image * channels + cols, mask=col_ok, other=0.0)
        b = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + offsets, (x * f[None, :] + b[None, :]).to(out_ptr.dtype.element_ty), mask=ok)
