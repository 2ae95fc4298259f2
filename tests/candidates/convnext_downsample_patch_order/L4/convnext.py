# WRONG: the 2x2 downsampling convolution written as a GEMM over the channels-last map, each patch
# gathered as a (row, column, channel) vector but multiplied with the conv weight flattened in its own
# (channel, row, column) order: the taps meet the wrong weights (the stem's 4x4 conv is left right).
import torch
from kernels_reference.L4.convnext import ConvNextV2Model as _Ref


def _downsample_hwc_patches(down, x):
    normed = down.norm(x.permute(0, 2, 3, 1))  # [B, H, W, C]
    b, h, w, c = normed.shape
    hp, wp = h // 2, w // 2
    patches = normed[:, :2 * hp, :2 * wp].reshape(b, hp, 2, wp, 2, c).transpose(2, 3).reshape(b * hp * wp, 4 * c)
    weight = down.conv.proj.weight.reshape(down.conv.proj.weight.shape[0], -1)
    out = torch.addmm(down.conv.proj.bias.float(), patches.float(), weight.float().t()).to(x.dtype)
    return out.view(b, hp, wp, -1).permute(0, 3, 1, 2)


class ConvNextV2Model(_Ref):
    def forward(self, pixel_values):
        x = self.stem(pixel_values)
        for stage in self.stages:
            if stage.downsample is not None:
                x = _downsample_hwc_patches(stage.downsample, x)
            for block in stage.blocks:
                x = block(x)
        pooled = x.float().mean(dim=(2, 3)).to(x.dtype)
        return x, self.head_norm(pooled)
