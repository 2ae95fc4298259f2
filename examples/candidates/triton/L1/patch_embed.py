import torch
from torch import nn


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


class PatchEmbed(nn.Module):
    def __init__(self, img_size=224, patch_size=16, in_chans=3, embed_dim=768, bias=True, flatten=True):
        super().__init__()
        self.patch_size = _pair(patch_size)
        self.embed_dim, self.flatten = embed_dim, flatten
        # Only the parameter layout of a conv ([D, C, p, p] and [D]) is used, so checkpoints load.
        self.proj = nn.Conv2d(in_chans, embed_dim, self.patch_size, stride=self.patch_size, bias=bias)

    def forward(self, x):
        b, c, h, w = x.shape
        ph, pw = self.patch_size
        gh, gw = h // ph, w // pw
        # Each patch as a (row, column, channel) vector: the pixels of a patch row are contiguous
        # in a channels-last image, and a contiguous one pays the same single gather.
        pixels = x[:, :, :gh * ph, :gw * pw].permute(0, 2, 3, 1)  # [B, H, W, C], a view
        patches = pixels.reshape(b, gh, ph, gw, pw, c).transpose(2, 3).reshape(b * gh * gw, ph * pw * c)
        # The weight read in the same (row, column, channel) order; one GEMM with the bias fused.
        weight = self.proj.weight.permute(0, 2, 3, 1).reshape(self.embed_dim, ph * pw * c)
        if self.proj.bias is not None:
            tokens = torch.addmm(self.proj.bias, patches, weight.t())
        else:
            tokens = patches @ weight.t()
        tokens = tokens.view(b, gh * gw, self.embed_dim)
        return tokens if self.flatten else tokens.transpose(1, 2).reshape(b, self.embed_dim, gh, gw)
