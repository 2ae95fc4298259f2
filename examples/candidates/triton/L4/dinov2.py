"""Dinov2Model from this tree's modules: the one-GEMM patch embedding, the class token and resampled
position table written by the Triton assembly kernel, this tree's DINOv2 layers, then the Triton
LayerNorm. Images must be whole patches, as the reference serves them."""
from torch import nn

from ..L1.dinov2_embeddings import Dinov2PositionEmbedding
from ..L1.layer_norm import LayerNorm
from ..L1.patch_embed import PatchEmbed
from ..L3.dinov2_layer import Dinov2Layer


def _get(config, key, default=None):
    return config.get(key, default) if isinstance(config, dict) else getattr(config, key, default)


class Dinov2Embeddings(nn.Module):
    def __init__(self, hidden_size, image_size, patch_size, num_channels=3):
        super().__init__()
        self.patch_size = patch_size
        self.patch_embeddings = PatchEmbed(img_size=image_size, patch_size=patch_size, in_chans=num_channels,
                                           embed_dim=hidden_size)
        self.position_embedding = Dinov2PositionEmbedding(hidden_size, image_size, patch_size)

    def forward(self, pixel_values):
        height, width = pixel_values.shape[2:]
        tokens = self.patch_embeddings(pixel_values)
        return self.position_embedding(tokens, height // self.patch_size, width // self.patch_size)


class Dinov2Encoder(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layer = nn.ModuleList(
            Dinov2Layer(_get(config, "hidden_size"), _get(config, "num_attention_heads"), _get(config, "mlp_ratio", 4),
                        _get(config, "layer_norm_eps", 1e-6), _get(config, "hidden_act", "gelu"),
                        _get(config, "layerscale_value", 1.0))
            for _ in range(_get(config, "num_hidden_layers")))

    def forward(self, hidden_states):
        for layer in self.layer:
            hidden_states = layer(hidden_states)
        return hidden_states


class Dinov2Model(nn.Module):
    def __init__(self, config):
        super().__init__()
        hidden, self.patch_size = _get(config, "hidden_size"), _get(config, "patch_size", 14)
        self.embeddings = Dinov2Embeddings(hidden, _get(config, "image_size", 518), self.patch_size,
                                           _get(config, "num_channels", 3))
        self.encoder = Dinov2Encoder(config)
        self.layernorm = LayerNorm(hidden, eps=_get(config, "layer_norm_eps", 1e-6))

    def forward(self, pixel_values):
        if pixel_values.dim() != 4 or any(side % self.patch_size for side in pixel_values.shape[2:]):
            raise ValueError(f"expected [B, C, H, W] with H and W multiples of {self.patch_size}, "
                             f"got {tuple(pixel_values.shape)}")
        return self.layernorm(self.encoder(self.embeddings(pixel_values)))
