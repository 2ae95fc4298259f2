# WRONG: the axes swapped: the first quarter of each head turns with the patch's column and the second
# with its row (a (x, y) grid where the model's is (y, x)). Off the diagonal every patch gets another's angles.
from kernels_reference.L1.rope_2d import DINOv3ViTRopePositionEmbedding as _Ref


class DINOv3ViTRopePositionEmbedding(_Ref):
    @staticmethod
    def patch_centres(grid_height, grid_width, dtype, device=None):
        return _Ref.patch_centres(grid_height, grid_width, dtype, device).flip(-1)

    def forward(self, query, key, grid_height, grid_width):
        return self.forward_native(query, key, grid_height, grid_width)
