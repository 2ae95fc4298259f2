"""SiglipVisionModel from this tree's modules: the one-GEMM patch embedding plus the position table,
this tree's encoder layers, then the Triton LayerNorm. Images at the native grid only, as the
reference serves them."""
from torch import nn

from ..L1.layer_norm import LayerNorm
from ..L1.patch_embed import PatchEmbed
from ..L3.siglip_encoder_layer import SiglipEncoderLayer


def _get(config, key, default=None):
    return config.get(key, default) if isinstance(config, dict) else getattr(config, key, default)


class SiglipVisionEmbeddings(nn.Module):
    def __init__(self, hidden_size, image_size, patch_size, num_channels=3):
        super().__init__()
        self.patch_embedding = PatchEmbed(img_size=image_size, patch_size=patch_size, in_chans=num_channels,
                                          embed_dim=hidden_size)
        self.num_patches = (image_size // patch_size) ** 2
        self.position_embedding = nn.Embedding(self.num_patches, hidden_size)

    def forward(self, pixel_values):
        tokens = self.patch_embedding(pixel_values)
        if tokens.shape[1] != self.num_patches:
            raise ValueError(f"{tokens.shape[1]} patches; the position table holds {self.num_patches}")
        return tokens + self.position_embedding.weight.to(tokens.dtype)


class SiglipEncoder(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layers = nn.ModuleList(
            SiglipEncoderLayer(_get(config, "hidden_size"), _get(config, "num_attention_heads"),
                               _get(config, "intermediate_size"), _get(config, "layer_norm_eps", 1e-6),
                               _get(config, "hidden_act", "gelu_pytorch_tanh"))
            for _ in range(_get(config, "num_hidden_layers")))

    def forward(self, hidden_states):
        for layer in self.layers:
            hidden_states = layer(hidden_states)
        return hidden_states


class SiglipVisionModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        hidden = _get(config, "hidden_size")
        self.embeddings = SiglipVisionEmbeddings(hidden, _get(config, "image_size"), _get(config, "patch_size"),
                                                 _get(config, "num_channels", 3))
        self.encoder = SiglipEncoder(config)
        self.post_layernorm = LayerNorm(hidden, eps=_get(config, "layer_norm_eps", 1e-6))

    def forward(self, pixel_values):
        return self.post_layernorm(self.encoder(self.embeddings(pixel_values)))
