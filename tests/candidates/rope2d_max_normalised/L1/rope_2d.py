# WRONG: both axes divided by the longer side's patch count (DINOv3's "max" coordinate option, which
# its checkpoints do not use): the same as the model's per-axis normalisation on a square grid, a
# squeezed short axis on any other.
import torch
from kernels_reference.L1.rope_2d import DINOv3ViTRopePositionEmbedding as _Ref


class DINOv3ViTRopePositionEmbedding(_Ref):
    @staticmethod
    def patch_centres(grid_height, grid_width, dtype, device=None):
        longer = max(grid_height, grid_width)
        ys = (torch.arange(grid_height, dtype=dtype, device=device) + 0.5) / longer * 2 - 1
        xs = (torch.arange(grid_width, dtype=dtype, device=device) + 0.5) / longer * 2 - 1
        y, x = torch.meshgrid(ys, xs, indexing="ij")
        return torch.stack([y, x], dim=-1).reshape(-1, 2)

    def forward(self, query, key, grid_height, grid_width):
        return self.forward_native(query, key, grid_height, grid_width)
