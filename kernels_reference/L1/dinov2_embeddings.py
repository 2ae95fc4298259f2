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
stays float64: the correctness truth), one rounding at the end. The CUDA path is production's
sequence of torch ops (F.interpolate's bicubic kernel, the table rounded to the activation dtype,
the add, the class row concatenated): the resampled table is a few hundred KB, so a hand-written kernel would
only save the launch of a tiny interpolation; the rounding of the table is within the bar.
"""
from typing import Dict

import torch
import torch.nn.functional as F
from torch import nn

from ..dispatch import compute_dtype
from ..records import RecordsInit

HF_EMBEDDING_NAMES = ("cls_token", "position_embeddings")


class Dinov2PositionEmbedding(RecordsInit, nn.Module):
    def __init__(self, hidden_size: int, image_size: int = 518, patch_size: int = 14):
        super().__init__()
        self.hidden_size = hidden_size
        self.native_grid = image_size // patch_size
        self.cls_token = nn.Parameter(torch.zeros(1, 1, hidden_size))
        self.position_embeddings = nn.Parameter(torch.zeros(1, 1 + self.native_grid ** 2, hidden_size))

    def forward(self, embeddings: torch.Tensor, grid_height: int, grid_width: int) -> torch.Tensor:
        # Plain torch ops either way (Dynamo traces them as they are); CUDA takes production's sequence.
        if embeddings.is_cuda:
            return self.forward_fast(embeddings, grid_height, grid_width)
        return self.forward_native(embeddings, grid_height, grid_width)

    def forward_native(self, embeddings, grid_height, grid_width):
        self._check(embeddings, grid_height, grid_width)
        dt = compute_dtype(embeddings.dtype)
        table = self.position_table(grid_height, grid_width, dt)
        cls = self.cls_token.to(dt).expand(embeddings.shape[0], 1, self.hidden_size)
        return (torch.cat((cls, embeddings.to(dt)), dim=1) + table).to(embeddings.dtype)

    def forward_fast(self, embeddings, grid_height, grid_width):
        """The table resampled in float32 and rounded to the activation dtype, as Hugging Face
        does; the class row and the patch rows summed apart and concatenated."""
        self._check(embeddings, grid_height, grid_width)
        table = self.position_table(grid_height, grid_width, torch.float32).to(embeddings.dtype)
        cls = (self.cls_token.to(embeddings.dtype) + table[:, :1]).expand(embeddings.shape[0], 1, self.hidden_size)
        return torch.cat((cls, embeddings + table[:, 1:]), dim=1)

    def position_table(self, grid_height: int, grid_width: int, dtype: torch.dtype) -> torch.Tensor:
        """[1, 1 + h * w, D] in ``dtype``: the class row, then the native table resampled bicubically
        to h x w (row-major), computed in ``dtype``."""
        pos = self.position_embeddings.to(dtype)
        g = self.native_grid
        if (grid_height, grid_width) == (g, g):
            return pos
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


def hf_embeddings_state_dict(hf_state: Dict[str, torch.Tensor], prefix: str = "embeddings.") -> Dict[str, torch.Tensor]:
    """This module's parameters out of a Hugging Face DINOv2 state dict (``Dinov2Model``'s keys
    start ``embeddings.``; ``Dinov2Embeddings``' own have no prefix). The patch projection belongs
    to ``PatchEmbed`` (``patch_embeddings.projection`` -> ``proj``) and the mask token to training."""
    return {name: hf_state[prefix + name] for name in HF_EMBEDDING_NAMES}
