# WRONG: the position table is not resampled to the image's grid: its first 1 + h * w rows are
# added instead (a port that slices ``pos_embed[:, :tokens]``). Right only at the native grid, where
# the whole table is used as it is.
import torch

from kernels_reference.L4.dinov2 import Dinov2Model as _Ref


class Dinov2Model(_Ref):
    def forward(self, pixel_values):
        patches = self.embeddings.patch_embeddings(pixel_values)
        positions = self.embeddings.position_embedding
        cls = positions.cls_token.to(patches.dtype).expand(patches.shape[0], 1, patches.shape[2])
        tokens = torch.cat((cls, patches), dim=1)
        tokens = tokens + positions.position_embeddings[:, :tokens.shape[1]].to(tokens.dtype)
        return self.layernorm(self.encoder(tokens))
