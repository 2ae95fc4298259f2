# WRONG: the table resampled bilinearly (a smoother, different filter than the bicubic one trained against).
import torch
import torch.nn.functional as F
from kernels_reference.L1.dinov2_embeddings import Dinov2PositionEmbedding as _Ref


class Dinov2PositionEmbedding(_Ref):
    def position_table(self, grid_height, grid_width, dtype):
        pos, g = self.position_embeddings.to(dtype), self.native_grid
        grid = pos[:, 1:].reshape(1, g, g, -1).permute(0, 3, 1, 2)
        grid = F.interpolate(grid, size=(grid_height, grid_width), mode="bilinear", align_corners=False)
        return torch.cat((pos[:, :1], grid.permute(0, 2, 3, 1).reshape(1, grid_height * grid_width, -1)), dim=1)

    def forward(self, embeddings, grid_height, grid_width):
        return self.forward_native(embeddings, grid_height, grid_width)
