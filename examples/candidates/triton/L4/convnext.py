"""ConvNextV2Model from this tree's modules: the one-GEMM patch embedding as the 4x4 stem and as
each 2x2 downsampling convolution, this tree's ConvNeXt blocks, then the spatial mean. The stem's,
the downsampling layers' and the head's LayerNorms are torch's over each pixel's channels (as timm's
LayerNorm2d runs them): five small launches beside the blocks' kernels. Returns
(last_hidden_state, pooler_output)."""
from torch import nn

from ..L1.patch_embed import PatchEmbed
from ..L3.convnext_block import ConvNeXtBlock


def _get(config, key, default=None):
    return config.get(key, default) if isinstance(config, dict) else getattr(config, key, default)


def _norm_channels(norm, x):
    """LayerNorm over dim 1 of [B, C, H, W]: the rows are the pixels' channel vectors."""
    return norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class _Stem(nn.Module):
    def __init__(self, in_chans, dim, patch):
        super().__init__()
        self.conv = PatchEmbed(patch_size=patch, in_chans=in_chans, embed_dim=dim, flatten=False)
        self.norm = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, x):
        return _norm_channels(self.norm, self.conv(x))


class _Downsample(nn.Module):
    def __init__(self, dim_in, dim_out):
        super().__init__()
        self.norm = nn.LayerNorm(dim_in, eps=1e-6)
        self.conv = PatchEmbed(patch_size=2, in_chans=dim_in, embed_dim=dim_out, flatten=False)

    def forward(self, x):
        return self.conv(_norm_channels(self.norm, x))


class _Stage(nn.Module):
    def __init__(self, dim_in, dim, depth, kernel, ratio, first):
        super().__init__()
        self.downsample = None if first else _Downsample(dim_in, dim)
        self.blocks = nn.ModuleList(ConvNeXtBlock(dim, kernel_size=kernel, mlp_ratio=ratio) for _ in range(depth))

    def forward(self, x):
        if self.downsample is not None:
            x = self.downsample(x)
        for block in self.blocks:
            x = block(x)
        return x


class ConvNextV2Model(nn.Module):
    def __init__(self, config):
        super().__init__()
        dims, depths = list(_get(config, "hidden_sizes")), list(_get(config, "depths"))
        kernel, ratio = _get(config, "kernel_size", 7), _get(config, "mlp_ratio", 4)
        self.stem = _Stem(_get(config, "num_channels", 3), dims[0], _get(config, "patch_size", 4))
        self.stages = nn.ModuleList(
            _Stage(dims[i - 1] if i else dims[0], dims[i], depths[i], kernel, ratio, first=i == 0)
            for i in range(len(dims)))
        self.head_norm = nn.LayerNorm(dims[-1], eps=_get(config, "layer_norm_eps", 1e-12))

    def forward(self, pixel_values):
        x = self.stem(pixel_values)
        for stage in self.stages:
            x = stage(x)
        pooled = x.float().mean(dim=(2, 3)).to(x.dtype)
        return x, self.head_norm(pooled)
