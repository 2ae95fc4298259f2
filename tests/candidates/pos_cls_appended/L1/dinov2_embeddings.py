# WRONG: the class token appended after the patches instead of prepended (each row still gets its
# own position embedding).
import torch
from kernels_reference.L1.dinov2_embeddings import Dinov2PositionEmbedding as _Ref


class Dinov2PositionEmbedding(_Ref):
    def forward(self, embeddings, grid_height, grid_width):
        table = self.position_table(grid_height, grid_width, torch.float32)
        cls = (self.cls_token.float() + table[:, :1]).expand(embeddings.shape[0], 1, -1)
        out = torch.cat((embeddings.float() + table[:, 1:], cls), dim=1)
        return out.to(embeddings.dtype)
