"""Patch embedding of vision transformers: non-overlapping p x p patches projected to tokens.

timm's ``PatchEmbed`` (DINOv2, DINOv3 and SigLIP towers in timm), Hugging Face's
``Dinov2PatchEmbeddings`` / ``SiglipVisionEmbeddings.patch_embedding`` and vLLM's SigLIP all hold
one ``Conv2d(in_chans, embed_dim, kernel_size=p, stride=p)`` with a bias and turn its output into
tokens with ``flatten(2).transpose(1, 2)``: patch ``(i, j)`` of the ``Hp x Wp`` grid becomes token
``i * Wp + j`` (row by row). The parameters are named ``proj.weight`` [D, C, p, p] and
``proj.bias`` [D], as in timm, so a timm state dict loads unchanged (HF's ``projection`` /
``patch_embedding`` keys map by renaming the prefix).

The constructor takes timm's arguments. ``img_size`` only sets ``grid_size`` / ``num_patches``
(the checkpoint's native size); other sizes run, as in HF's and vLLM's modules, since DINOv2/v3
serve other sizes with interpolated or rotary positions. The grid is ``floor(H / p) x floor(W / p)``:
rows and columns past the last whole patch are not read, as the strided "valid" convolution of
every implementation above leaves them (SigLIP so400m/14 at its native 384 px reads 27 x 14 = 378
of them, in timm too). An image smaller than one patch is refused.

Semantics (``forward_native``): each patch read as a vector in (channel, row, column) order, the
weight's own flattening, times the weight plus the bias, in float32 for half types (float64 stays
float64: that run is the correctness truth), rounded once to the input dtype.

The fast path on CUDA, in half types, is that product as one cuBLAS GEMM: the patches gathered
into rows by one copy (the image's bytes once), ``addmm`` with the bias, tokens contiguous. On the
H200 on 2026-12-05 cuDNN's strided convolution (what ``nn.Conv2d`` runs) took 4-17x as long on
every bf16 case of the task (DINOv3 ViT-L/16 at 512 px, batch 32: 2868 us against 167 us for the
GEMM), so the convolution would have been a weak reference. In float32 the fast path stays
production's ``F.conv2d``: torch's default cuDNN precision lets it use TF32, as torch hub's float32
DINOv2 does, and a float32 GEMM would hold candidates to a stricter bar than production meets.
"""
from typing import Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from ..dispatch import compute_dtype
from ..records import RecordsInit

Size2 = Union[int, Tuple[int, int]]


def _pair(value: Size2) -> Tuple[int, int]:
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))


class PatchEmbed(RecordsInit, nn.Module):
    def __init__(self, img_size: Size2 = 224, patch_size: Size2 = 16, in_chans: int = 3, embed_dim: int = 768,
                 bias: bool = True, flatten: bool = True):
        super().__init__()
        self.img_size = _pair(img_size)
        self.patch_size = _pair(patch_size)
        self.grid_size = (self.img_size[0] // self.patch_size[0], self.img_size[1] // self.patch_size[1])
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.in_chans, self.embed_dim, self.flatten = in_chans, embed_dim, flatten
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=self.patch_size, stride=self.patch_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [B, C, H, W] -> [B, Hp * Wp, D] (``flatten``) or [B, D, Hp, Wp]; Hp = H // p, Wp = W // p."""
        # cuDNN on CUDA under torch.compile too: production's nn.Conv2d stays a cuDNN call there
        # (Inductor does not decompose convolutions), so there is no fusion to open up.
        if x.is_cuda:
            return self.forward_gemm(x) if x.dtype in (torch.float16, torch.bfloat16) else self.forward_conv(x)
        return self.forward_native(x)

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        batch, (hp, wp) = x.shape[0], self.output_grid(x)
        ph, pw = self.patch_size
        dt = compute_dtype(x.dtype)
        x = x[:, :, :hp * ph, :wp * pw]  # whole patches only
        # [B, C, Hp, ph, Wp, pw] -> [B, Hp, Wp, C, ph, pw]: one row per patch, row-major over the grid
        patches = x.reshape(batch, self.in_chans, hp, ph, wp, pw).permute(0, 2, 4, 1, 3, 5)
        patches = patches.reshape(batch, hp * wp, self.in_chans * ph * pw).to(dt)
        out = patches @ self.proj.weight.reshape(self.embed_dim, -1).to(dt).t()
        if self.proj.bias is not None:
            out = out + self.proj.bias.to(dt)
        out = out.to(x.dtype)
        return out if self.flatten else out.transpose(1, 2).reshape(batch, self.embed_dim, hp, wp)

    def forward_gemm(self, x: torch.Tensor) -> torch.Tensor:
        """Patches as rows (one gather copy, in either memory format), one GEMM with the bias."""
        batch, (hp, wp) = x.shape[0], self.output_grid(x)
        ph, pw = self.patch_size
        x = x[:, :, :hp * ph, :wp * pw]
        rows = x.reshape(batch, self.in_chans, hp, ph, wp, pw).permute(0, 2, 4, 1, 3, 5)
        rows = rows.reshape(batch * hp * wp, self.in_chans * ph * pw)
        weight = self.proj.weight.reshape(self.embed_dim, -1).to(x.dtype)
        if self.proj.bias is not None:
            out = torch.addmm(self.proj.bias.to(x.dtype), rows, weight.t())
        else:
            out = rows @ weight.t()
        out = out.view(batch, hp * wp, self.embed_dim)
        return out if self.flatten else out.transpose(1, 2).reshape(batch, self.embed_dim, hp, wp)

    def forward_conv(self, x: torch.Tensor) -> torch.Tensor:
        self.output_grid(x)
        out = F.conv2d(x, self.proj.weight, self.proj.bias, stride=self.patch_size)
        return out.flatten(2).transpose(1, 2) if self.flatten else out

    def output_grid(self, x: torch.Tensor) -> Tuple[int, int]:
        """The patch grid (Hp, Wp) of ``x``: whole patches only."""
        return patch_grid(x, self.patch_size, self.in_chans)

    def extra_repr(self) -> str:
        return (f"img_size={self.img_size}, patch_size={self.patch_size}, in_chans={self.in_chans}, "
                f"embed_dim={self.embed_dim}, flatten={self.flatten}")


def patch_grid(x: torch.Tensor, patch_size: Size2, in_chans: int, owner: str = "PatchEmbed") -> Tuple[int, int]:
    """The grid (Hp, Wp) of whole ``patch_size`` patches in images ``x`` [B, in_chans, H, W]; a
    ValueError naming ``owner`` for any other shape or an image smaller than one patch. The models
    that hold a ``PatchEmbed`` call this with their own patch size rather than a method of the
    child: a candidate's patch embedding need not have one."""
    if x.dim() != 4 or x.shape[1] != in_chans:
        raise ValueError(f"{owner} expects images [B, {in_chans}, H, W], got {tuple(x.shape)}")
    (h, w), (ph, pw) = x.shape[2:], _pair(patch_size)
    if h < ph or w < pw:
        raise ValueError(f"{owner}: a {h}x{w} image holds no whole {ph}x{pw} patch")
    return h // ph, w // pw
