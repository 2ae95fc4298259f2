# WRONG: the patch grid handed to the layers as (width, height), an image-size convention mixed up: the
# same token count, so nothing complains, and the same rotation on a square image; on any other
# every patch is rotated as if the rows were columns.
from kernels_reference.L4.dinov3 import DINOv3ViTModel as _Ref


class DINOv3ViTModel(_Ref):
    def forward(self, pixel_values):
        grid_height, grid_width = self.patch_grid(pixel_values)
        tokens = self.embeddings(pixel_values.to(self.norm.weight.dtype))
        return self.norm(self.model(tokens, grid_width, grid_height))
