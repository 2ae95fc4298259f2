# a bare PatchEmbed written the ordinary way: a strided conv, no helper methods
import torch
from torch import nn


class PatchEmbed(nn.Module):
    def __init__(self, img_size=224, patch_size=16, in_chans=3, embed_dim=768, bias=True, flatten=True):
        super().__init__()
        self.proj = nn.Conv2d(in_chans, embed_dim, patch_size, stride=patch_size, bias=bias)
        self.flatten = flatten

    def forward(self, x):
        out = self.proj(x)
        return out.flatten(2).transpose(1, 2) if self.flatten else out
