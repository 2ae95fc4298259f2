"""SiglipVisionModel: a SigLIP / SigLIP-2 vision tower, normalised pixels in, patch tokens out.

``forward(pixel_values[B, 3, H, W]) -> last_hidden_state[B, N, D]``: the patch embedding (a p x p
convolution with stride p, ``PatchEmbed``), plus a learned position table over the native grid
(no class token), then the encoder layers, then ``post_layernorm``. SigLIP-2 so400m/14 at 384 px:
27 x 27 = 729 tokens of width 1152 (the 6 pixel rows and columns past the last whole patch are not
read, as in every implementation).

Only the native grid is served: the FixRes SigLIP-2 checkpoints are trained and served at one image
size, so the position table is added as it is and another grid is refused with an error naming the
one this model takes (Hugging Face's ``interpolate_pos_encoding`` is off by default, and vLLM feeds
these towers images resized to the native size).

The multihead-attention pooling head (``vision_use_head``: one learned probe attending over the
tokens) is not part of this model: embedding servers and VLMs that use the tower read its tokens,
and the head's own parts are the L1 attention and MLP already covered. Its checkpoint keys are
skipped by ``hf_state_dict``.

Parameter names follow Hugging Face's ``SiglipVisionTransformer`` (``embeddings``, ``encoder.layers``,
``post_layernorm``) with vLLM's fused ``qkv_proj`` inside each layer; ``hf_state_dict`` maps a
Hugging Face state dict (a ``SiglipVisionModel``'s, or a full checkpoint's ``vision_model.`` keys)
onto them.
"""
from typing import Any, Dict

import torch
from torch import nn

from ..checkpoint import strip_prefixes
from ..L1.layer_norm import LayerNorm
from ..L1.patch_embed import PatchEmbed, patch_grid
from ..L3.siglip_encoder_layer import SiglipEncoderLayer, hf_layer_state_dict
from ..model_config import _getter
from ..native import LayerStack, run
from ..records import RecordsInit

_HF_PREFIXES = ("vision_model.",)  # SiglipModel / Siglip2Model checkpoints keep the tower under it


class SiglipVisionEmbeddings(RecordsInit, nn.Module):
    def __init__(self, hidden_size: int, image_size: int, patch_size: int, num_channels: int = 3):
        super().__init__()
        self.patch_embedding = PatchEmbed(img_size=image_size, patch_size=patch_size, in_chans=num_channels,
                                          embed_dim=hidden_size)
        self.grid_size = self.patch_embedding.grid_size
        self.patch_size, self.num_channels = patch_size, num_channels
        self.position_embedding = nn.Embedding(self.patch_embedding.num_patches, hidden_size)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self._forward(pixel_values, native=False)

    def forward_native(self, pixel_values):
        return self._forward(pixel_values, native=True)

    def _forward(self, pixel_values, native):
        grid = patch_grid(pixel_values, self.patch_size, self.num_channels, type(self).__name__)
        if grid != self.grid_size:
            (hp, wp), (h, w) = self.grid_size, pixel_values.shape[2:]
            raise ValueError(f"SiglipVisionEmbeddings: a {h}x{w} image is a {grid[0]} x {grid[1]} patch grid; this "
                             f"model's position table is for its native {hp} x {wp} grid only (resize the image)")
        tokens = run(self.patch_embedding, native, pixel_values)
        # the table in the activation dtype, one rounding of the sum (Hugging Face's order and dtypes)
        return tokens + self.position_embedding.weight.to(tokens.dtype)


class SiglipEncoder(RecordsInit, LayerStack, nn.Module):
    LAYERS = "layers"

    def __init__(self, hidden_size, num_attention_heads, intermediate_size, num_hidden_layers, layer_norm_eps,
                 hidden_act):
        super().__init__()
        self.layers = nn.ModuleList(
            SiglipEncoderLayer(hidden_size, num_attention_heads, intermediate_size, layer_norm_eps, hidden_act)
            for _ in range(num_hidden_layers))


class SiglipVisionModel(RecordsInit, nn.Module):
    def __init__(self, config: Any):
        """``config``: a ``SiglipVisionConfig`` (object or dict, e.g. tasks/configs' vision config)."""
        super().__init__()
        get = _getter(config)
        hidden, eps = get("hidden_size"), get("layer_norm_eps", 1e-6)
        self.embeddings = SiglipVisionEmbeddings(hidden, get("image_size"), get("patch_size"),
                                                 get("num_channels", 3))
        self.encoder = SiglipEncoder(hidden, get("num_attention_heads"), get("intermediate_size"),
                                     get("num_hidden_layers"), eps, get("hidden_act", "gelu_pytorch_tanh"))
        self.post_layernorm = LayerNorm(hidden, eps=eps)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self._forward(pixel_values, native=False)

    def forward_native(self, pixel_values):
        return self._forward(pixel_values, native=True)

    def _forward(self, pixel_values, native):
        hidden_states = run(self.encoder, native, run(self.embeddings, native, pixel_values))
        return run(self.post_layernorm, native, hidden_states)


def hf_state_dict(hf_state: Dict[str, torch.Tensor], num_hidden_layers: int) -> Dict[str, torch.Tensor]:
    """A ``SiglipVisionModel`` state dict from a Hugging Face one: the ``vision_model.`` prefix dropped
    where present, the conv's ``patch_embedding`` as ``PatchEmbed``'s ``proj``, each layer through
    ``hf_layer_state_dict``; the pooling head and the text tower are not read."""
    state = strip_prefixes(hf_state, _HF_PREFIXES)
    ours = {f"embeddings.patch_embedding.proj.{p}": state[f"embeddings.patch_embedding.{p}"]
            for p in ("weight", "bias")}
    ours["embeddings.position_embedding.weight"] = state["embeddings.position_embedding.weight"]
    ours.update({f"post_layernorm.{p}": state[f"post_layernorm.{p}"] for p in ("weight", "bias")})
    for i in range(num_hidden_layers):
        layer = hf_layer_state_dict(state, f"encoder.layers.{i}.")
        ours.update({f"encoder.layers.{i}.{k}": v for k, v in layer.items()})
    return ours
