# WRONG: the projection without its bias (a GEMM epilogue that never adds it).
import torch.nn.functional as F
from kernels_reference.L1.patch_embed import PatchEmbed as _Ref


class PatchEmbed(_Ref):
    def forward(self, x):
        self.output_grid(x)
        grid = F.conv2d(x.float(), self.proj.weight.float(), None, stride=self.patch_size)
        return grid.flatten(2).transpose(1, 2).to(x.dtype)
