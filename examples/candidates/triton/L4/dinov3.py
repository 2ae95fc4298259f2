"""DINOv3ViTModel from this tree's modules: the one-GEMM patch embedding, the class and register tokens
put in front of the patch tokens, this tree's DINOv3 layers (the Triton 2-D RoPE inside each), then
the Triton LayerNorm as the final ``norm``. Pixels past the last whole patch are not read."""
import torch
from torch import nn

from ..L1.layer_norm import LayerNorm
from ..L1.patch_embed import PatchEmbed
from ..L3.dinov3_layer import DINOv3ViTLayer


def _get(config, key, default=None):
    value = config.get(key) if isinstance(config, dict) else getattr(config, key, None)
    return default if value is None else value


class DINOv3ViTEmbeddings(nn.Module):
    def __init__(self, hidden_size, patch_size, image_size=224, num_channels=3, num_register_tokens=0):
        super().__init__()
        self.patch_embeddings = PatchEmbed(img_size=image_size, patch_size=patch_size, in_chans=num_channels,
                                           embed_dim=hidden_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, hidden_size))
        self.register_tokens = nn.Parameter(torch.zeros(1, num_register_tokens, hidden_size))

    def forward(self, pixel_values):
        patches = self.patch_embeddings(pixel_values)
        b = patches.shape[0]
        return torch.cat([self.cls_token.to(patches.dtype).expand(b, -1, -1),
                          self.register_tokens.to(patches.dtype).expand(b, -1, -1), patches], dim=1)


class DINOv3ViTEncoder(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layer = nn.ModuleList(DINOv3ViTLayer(config) for _ in range(_get(config, "num_hidden_layers")))

    def forward(self, hidden_states, grid_height, grid_width):
        for layer in self.layer:
            hidden_states = layer(hidden_states, grid_height, grid_width)
        return hidden_states


class DINOv3ViTModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        hidden = _get(config, "hidden_size")
        self.patch_size = _get(config, "patch_size", 16)
        self.embeddings = DINOv3ViTEmbeddings(hidden, self.patch_size, _get(config, "image_size", 224),
                                              _get(config, "num_channels", 3), _get(config, "num_register_tokens", 0))
        self.model = DINOv3ViTEncoder(config)
        self.norm = LayerNorm(hidden, eps=_get(config, "layer_norm_eps", 1e-5))

    def forward(self, pixel_values):
        grid_height, grid_width = (side // self.patch_size for side in pixel_values.shape[2:])
        tokens = self.embeddings(pixel_values.to(self.norm.weight.dtype))
        return self.norm(self.model(tokens, grid_height, grid_width))
