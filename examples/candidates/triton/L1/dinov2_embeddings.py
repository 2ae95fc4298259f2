"""DINOv2's class token and resampled position embeddings, added to the patch tokens.

The native table is resampled as two small matrix products with cubic-convolution weights
(Keys' kernel, a = -0.75, sample centres at half cells, edge cells repeated: torch's bicubic
without align_corners), in float32. One Triton kernel then writes every output row: the class row
(class token + its embedding) or patch token + resampled embedding, float32, one rounding.
"""
import math

import torch
import triton
import triton.language as tl
from torch import nn

CUBIC_A = -0.75


def _cubic_weights(n_out: int, n_in: int, device) -> torch.Tensor:
    """[n_out, n_in] float32: row i holds the four taps sampling the input at (i + 0.5) * n_in / n_out - 0.5."""
    weights = torch.zeros(n_out, n_in, dtype=torch.float64)
    scale = n_in / n_out
    for i in range(n_out):
        src = (i + 0.5) * scale - 0.5
        base = math.floor(src)
        t = src - base
        for offset, dist in zip((-1, 0, 1, 2), (1 + t, t, 1 - t, 2 - t)):
            if dist <= 1:
                w = ((CUBIC_A + 2) * dist - (CUBIC_A + 3)) * dist * dist + 1
            else:
                w = ((CUBIC_A * dist - 5 * CUBIC_A) * dist + 8 * CUBIC_A) * dist - 4 * CUBIC_A
            weights[i, min(max(base + offset, 0), n_in - 1)] += w
    return weights.to(device=device, dtype=torch.float32)


@triton.jit
def _assemble_rows(x_ptr, table_ptr, cls_ptr, out_ptr, n_rows, tokens, width,
                   ROWS: tl.constexpr, COLS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * COLS + tl.arange(0, COLS)
    position = rows % (tokens + 1)  # 0: the class row
    image = rows // (tokens + 1)
    col_ok = cols < width
    ok = (rows < n_rows)[:, None] & col_ok[None, :]
    is_patch = (position > 0)[:, None]
    src = (image * tokens + position - 1).to(tl.int64)[:, None] * width + cols[None, :]
    x = tl.load(x_ptr + src, mask=ok & is_patch, other=0.0).to(tl.float32)
    cls = tl.load(cls_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    base = tl.where(is_patch, x, cls)
    pos = tl.load(table_ptr + position.to(tl.int64)[:, None] * width + cols[None, :], mask=ok, other=0.0)
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * width + cols[None, :],
             (base + pos).to(out_ptr.dtype.element_ty), mask=ok)


class Dinov2PositionEmbedding(nn.Module):
    def __init__(self, hidden_size, image_size=518, patch_size=14):
        super().__init__()
        self.hidden_size = hidden_size
        self.native_grid = image_size // patch_size
        self.cls_token = nn.Parameter(torch.zeros(1, 1, hidden_size))
        self.position_embeddings = nn.Parameter(torch.zeros(1, 1 + self.native_grid ** 2, hidden_size))

    def _table(self, grid_height, grid_width, device):
        """[1 + h * w, D] float32: the class row, then the grid resampled (rows, then columns)."""
        g, d = self.native_grid, self.hidden_size
        pos = self.position_embeddings[0].float()
        if (grid_height, grid_width) == (g, g):
            return pos.contiguous()
        grid = pos[1:].view(g, g, d)
        wy, wx = _cubic_weights(grid_height, g, device), _cubic_weights(grid_width, g, device)
        resampled = torch.einsum("hg,gkd,wk->hwd", wy, grid, wx).reshape(grid_height * grid_width, d)
        return torch.cat((pos[:1], resampled)).contiguous()

    def forward(self, embeddings, grid_height, grid_width):
        batch, tokens, d = embeddings.shape
        if tokens != grid_height * grid_width or d != self.hidden_size:
            raise ValueError(f"expected [B, {grid_height * grid_width}, {self.hidden_size}], "
                             f"got {tuple(embeddings.shape)}")
        x = embeddings.contiguous()
        table = self._table(grid_height, grid_width, x.device)
        out = torch.empty(batch, tokens + 1, d, dtype=x.dtype, device=x.device)
        n_rows = batch * (tokens + 1)
        cols = min(1024, triton.next_power_of_2(d))
        rows = max(1, 4096 // cols) if x.is_cuda else max(1, (1 << 16) // cols)
        grid = (triton.cdiv(n_rows, rows), triton.cdiv(d, cols))
        _assemble_rows[grid](x, table, self.cls_token.reshape(-1), out, n_rows, tokens, d, ROWS=rows, COLS=cols)
        return out
