# WRONG: the last stage's blocks run ConvNeXt V1's MLP, fc1 -> GELU -> fc2 with GRN left out (a
# fused kernel for the small 7x7 maps written from the V1 block); GRN's parameters still load.
import torch.nn.functional as F
from kernels_reference.L4.convnext import ConvNextV2Model as _Ref


def _block_without_grn(block, x):
    mlp = block.mlp
    hidden = mlp.act(F.linear(block.conv_dw_norm(x), mlp.fc1.weight), mlp.fc1.bias)
    return mlp.fc2(hidden).permute(0, 3, 1, 2) + x


class ConvNextV2Model(_Ref):
    def forward(self, pixel_values):
        x = self.stem(pixel_values)
        last = len(self.stages) - 1
        for i, stage in enumerate(self.stages):
            if stage.downsample is not None:
                x = stage.downsample(x)
            for block in stage.blocks:
                x = _block_without_grn(block, x) if i == last else block(x)
        pooled = x.float().mean(dim=(2, 3)).to(x.dtype)
        return x, self.head_norm(pooled)
