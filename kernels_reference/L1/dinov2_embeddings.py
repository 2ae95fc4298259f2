"""DINOv2's token assembly after the patch embedding: the class token prepended, learned position
embeddings resampled to the image's patch grid, added.

Hugging Face's ``Dinov2Embeddings`` (what ``Dinov2Model`` serves) holds ``cls_token`` [1, 1, D] and
``position_embeddings`` [1, 1 + G * G, D] for the native grid (G = 37: 518 px at patch 14). For an
image of ``h x w`` patches it resamples the G x G table in ``interpolate_pos_encoding``: the
table upcast to float32, ``F.interpolate(size=(h, w), mode="bicubic", align_corners=False)``
(no antialiasing), rounded back to the parameters' dtype; the class row is never resampled. The
sum ``cat(cls_token, patches) + cat(class row, resampled table)`` is the layer stack's input. At
the native grid the table is used as it is (bicubic at scale 1 is the identity anyway).
Meta's torch hub model resamples with ``scale_factor=(h + 0.1) / G`` instead of ``size``: the
output grid is the same, the sampling positions move by a fraction of a cell. ``size`` is what
Hugging Face (and so ``transformers``-based serving) runs, and it is the definition here.

``forward(embeddings[B, h * w, D], grid_height, grid_width) -> [B, 1 + h * w, D]``, patches in
row-major grid order (``PatchEmbed``'s output). The parameters keep Hugging Face's names, so the
``embeddings.cls_token`` / ``embeddings.position_embeddings`` entries of a checkpoint load through
``hf_embeddings_state_dict``. The mask token (masked-image training only) is not held.

Semantics (``forward_native``): the resampling and the add in float32 for half types (float64
stays float64: the correctness truth), one rounding at the end. The CUDA path resamples in float32,
rounds the table to the activation dtype (as Hugging Face does; within the bar) and writes the sum
straight into the output, the class row apart.

At inference on CUDA the whole op is one Triton launch (``forward_triton``,
:mod:`kernels_reference.ops.position_embedding.bicubic_add`): each output cell's 4 x 4 source
neighbourhood resampled in float32, rounded, and added to that cell of every image. Under autograd
or ``torch.compile`` the torch sequence below (``forward_fast``) runs instead.

In that sequence the resampling is a matrix product, not ``F.interpolate``. Bicubic resampling with fixed
sizes is linear in the table: row i of the output grid mixes four rows of the input with weights
that depend only on the sizes, and the same for columns, so the whole resampling is one matrix
``K = kron(W_h, W_w)`` (plus 1 for the class row) applied to the table. torch's bicubic CUDA kernel
runs one thread per output pixel looping over every channel: 918 us for a 16 x 16 x 384 table on
the H200, against 14.7 us for Inductor's version of the same op (2026-12-05, ``python3 -m
fk_pytest.peers --device cuda --profile full --ops dinov2_position_embedding``). ``K`` is built
once per (grid, device) on the host in float64 from torch's definition (``bicubic_weights``) and
kept; it holds no parameter, so a changed table is always resampled anew. Grids whose ``K`` would be
large (more than ``_KRON_ELEMENTS``) resample rows and columns as two products instead.
"""
import functools
from typing import Dict

import torch
import torch.nn.functional as F
from torch import nn

from ..dispatch import compute_dtype, use_fast_path
from ..ops.position_embedding.bicubic_add import bicubic_add, bicubic_taps, triton
from ..records import RecordsInit

HF_EMBEDDING_NAMES = ("cls_token", "position_embeddings")
_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # float64 (the truth) stays in torch


class Dinov2PositionEmbedding(RecordsInit, nn.Module):
    def __init__(self, hidden_size: int, image_size: int = 518, patch_size: int = 14):
        super().__init__()
        self.hidden_size = hidden_size
        self.native_grid = image_size // patch_size
        self.cls_token = nn.Parameter(torch.zeros(1, 1, hidden_size))
        self.position_embeddings = nn.Parameter(torch.zeros(1, 1 + self.native_grid ** 2, hidden_size))

    def forward(self, embeddings: torch.Tensor, grid_height: int, grid_width: int) -> torch.Tensor:
        # CUDA: one Triton launch at inference; production's torch sequence where autograd records
        # or Dynamo traces (it traces plain torch ops as they are).
        if embeddings.is_cuda:
            if (triton is not None and use_fast_path(embeddings) and not torch.is_grad_enabled()
                    and embeddings.dtype in _KERNEL_DTYPES):
                return self.forward_triton(embeddings, grid_height, grid_width)
            return self.forward_fast(embeddings, grid_height, grid_width)
        return self.forward_native(embeddings, grid_height, grid_width)

    def forward_triton(self, embeddings, grid_height, grid_width):
        """``forward_fast``'s arithmetic in one launch (ops/position_embedding/bicubic_add.py)."""
        self._check(embeddings, grid_height, grid_width)
        return bicubic_add(embeddings, self.position_embeddings, self.cls_token, self.native_grid,
                           grid_height, grid_width)

    def forward_native(self, embeddings, grid_height, grid_width):
        self._check(embeddings, grid_height, grid_width)
        dt = compute_dtype(embeddings.dtype)
        table = self.position_table(grid_height, grid_width, dt)
        cls = self.cls_token.to(dt).expand(embeddings.shape[0], 1, self.hidden_size)
        return (torch.cat((cls, embeddings.to(dt)), dim=1) + table).to(embeddings.dtype)

    def forward_fast(self, embeddings, grid_height, grid_width):
        """The table resampled in float32 and rounded to the activation dtype, as Hugging Face
        does; the patch rows and the class row each summed into the output (no concatenation)."""
        self._check(embeddings, grid_height, grid_width)
        table = self.position_table(grid_height, grid_width, torch.float32, by_matrix=True).to(embeddings.dtype)
        cls = self.cls_token.to(embeddings.dtype) + table[:, :1]
        if torch.is_grad_enabled():  # out= takes no part in autograd: the concatenation then
            return torch.cat((cls.expand(embeddings.shape[0], 1, -1), embeddings + table[:, 1:]), dim=1)
        out = torch.empty((embeddings.shape[0], 1 + grid_height * grid_width, self.hidden_size),
                          dtype=embeddings.dtype, device=embeddings.device)
        torch.add(embeddings, table[:, 1:], out=out[:, 1:])
        out[:, :1] = cls
        return out

    def position_table(self, grid_height: int, grid_width: int, dtype: torch.dtype,
                       by_matrix: bool = False) -> torch.Tensor:
        """[1, 1 + h * w, D] in ``dtype``: the class row, then the native table resampled bicubically
        to h x w (row-major), computed in ``dtype``: ``F.interpolate`` (the definition, and the
        float64 truth on any device), or with ``by_matrix`` its matrix form in float32 (the same
        weights; the fast path's, see the module's docstring)."""
        pos = self.position_embeddings.to(dtype)
        g = self.native_grid
        if (grid_height, grid_width) == (g, g):
            return pos
        if by_matrix:
            return resample_on_device(pos.float(), g, grid_height, grid_width).to(dtype)
        grid = pos[:, 1:].reshape(1, g, g, self.hidden_size).permute(0, 3, 1, 2)
        grid = F.interpolate(grid, size=(grid_height, grid_width), mode="bicubic", align_corners=False)
        patches = grid.permute(0, 2, 3, 1).reshape(1, grid_height * grid_width, self.hidden_size)
        return torch.cat((pos[:, :1], patches), dim=1)

    def _check(self, embeddings, grid_height, grid_width):
        expected = (grid_height * grid_width, self.hidden_size)
        if embeddings.dim() != 3 or tuple(embeddings.shape[1:]) != expected:
            raise ValueError(f"Dinov2PositionEmbedding expects [B, {grid_height} * {grid_width}, {self.hidden_size}] "
                             f"patch tokens, got {tuple(embeddings.shape)}")

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, native_grid={self.native_grid}"


# Above this many elements (64 MB in float32, about a 100 x 100 patch grid) the kron matrix costs
# more to read than the table it resamples: rows and columns go as two products instead.
_KRON_ELEMENTS = 1 << 24
def bicubic_weights(out_size: int, in_size: int) -> torch.Tensor:
    """[out, in] float64: F.interpolate(mode="bicubic", align_corners=False, size=...) along one
    axis as a matrix, from the taps of ``bicubic_taps`` (taps clamped onto the same edge row add up)."""
    index, weight = bicubic_taps(out_size, in_size)
    return torch.zeros((out_size, in_size), dtype=torch.float64).scatter_add_(1, index, weight)


@functools.lru_cache(maxsize=32)
def _resampling(grid: int, height: int, width: int, device: torch.device):
    """The float32 matrices that resample a grid x grid table (sizes only, never a parameter):
    ("kron", [1 + h*w, 1 + g*g] with the class row passed through), or ("rows", W_h, W_w)."""
    wh, ww = bicubic_weights(height, grid), bicubic_weights(width, grid)
    if (1 + height * width) * (1 + grid * grid) <= _KRON_ELEMENTS:
        k = torch.zeros((1 + height * width, 1 + grid * grid), dtype=torch.float64)
        k[0, 0] = 1.0
        k[1:, 1:] = torch.kron(wh, ww)
        return ("kron", k.to(device=device, dtype=torch.float32))
    return ("rows", wh.to(device=device, dtype=torch.float32), ww.to(device=device, dtype=torch.float32))


def resample_on_device(pos: torch.Tensor, grid: int, height: int, width: int) -> torch.Tensor:
    """``pos`` [1, 1 + g*g, D] (float32) -> [1, 1 + h*w, D]: the class row, then the table
    resampled bicubically, by matrix products (any device; CUDA is where it pays)."""
    plan = _resampling(grid, height, width, pos.device)
    if plan[0] == "kron":
        return torch.matmul(plan[1], pos[0]).unsqueeze(0)
    _, wh, ww = plan
    d = pos.shape[-1]
    rows = torch.matmul(wh, pos[0, 1:].reshape(grid, grid * d)).reshape(height, grid, d)
    patches = torch.matmul(ww, rows).reshape(1, height * width, d)  # [h, w, d], batched over rows
    return torch.cat((pos[:, :1], patches), dim=1)


def hf_embeddings_state_dict(hf_state: Dict[str, torch.Tensor], prefix: str = "embeddings.") -> Dict[str, torch.Tensor]:
    """This module's parameters out of a Hugging Face DINOv2 state dict (``Dinov2Model``'s keys
    start ``embeddings.``; ``Dinov2Embeddings``' own have no prefix). The patch projection belongs
    to ``PatchEmbed`` (``patch_embeddings.projection`` -> ``proj``) and the mask token to training."""
    return {name: hf_state[prefix + name] for name in HF_EMBEDDING_NAMES}
