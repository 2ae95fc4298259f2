# WRONG: the patch tokens are taken to start right after the class token (DINOv2's layout without
# registers): the rotation covers tokens 1 .. N, so the register tokens are rotated with the first
# patches' angles, every patch is rotated as the patch four places before it, and the last four
# patches are not rotated.
import torch
from kernels_reference.L1.rope_2d import DINOv3ViTRopePositionEmbedding
from kernels_reference.L3.dinov3_layer import DINOv3ViTLayer as _Ref


class _PatchesAfterClassToken(DINOv3ViTRopePositionEmbedding):
    def forward(self, query, key, grid_height, grid_width):
        cos, sin = self.cos_sin(grid_height, grid_width, torch.float32, query.device)
        return tuple(self._rotate(x, cos, sin, grid_height * grid_width) for x in (query, key))

    def _rotate(self, x, cos, sin, n):
        heads = x.unflatten(-1, (-1, self.head_size))
        x1, x2 = heads[:, 1:1 + n].float().chunk(2, dim=-1)
        cos, sin = cos[None, :, None, :], sin[None, :, None, :]
        rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
        return torch.cat([heads[:, :1], rotated, heads[:, 1 + n:]], dim=1).reshape(x.shape)


class DINOv3ViTLayer(_Ref):
    def __init__(self, config):
        super().__init__(config)
        rope = self.attention.rotary_emb
        self.attention.rotary_emb = _PatchesAfterClassToken(rope.head_size, rope.base, rope.num_prefix_tokens)
