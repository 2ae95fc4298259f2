# WRONG: the rotation lands on the first grid_height * grid_width tokens instead of the last ones: the
# class and register tokens are rotated with the first patches' angles, every patch takes the angles
# of the patch num_prefix_tokens before it, and the last patches are left unrotated.
import torch
from kernels_reference.L1.rope_2d import DINOv3ViTRopePositionEmbedding as _Ref


class DINOv3ViTRopePositionEmbedding(_Ref):
    def forward(self, query, key, grid_height, grid_width):
        cos, sin = self.cos_sin(grid_height, grid_width, torch.float32, query.device)
        n = grid_height * grid_width
        return tuple(self._rotate_first(x, cos, sin, n) for x in (query, key))

    def _rotate_first(self, x, cos, sin, n):
        heads = x.unflatten(-1, (-1, self.head_size)) if x.dim() == 3 else x
        x1, x2 = heads[:, :n].float().chunk(2, dim=-1)
        cos, sin = cos[None, :, None, :], sin[None, :, None, :]
        rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
        return torch.cat([rotated, heads[:, n:]], dim=1).reshape(x.shape)
