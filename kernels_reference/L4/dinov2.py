"""Dinov2Model: a DINOv2 image encoder, normalised pixels in, the class token and patch tokens out.

``forward(pixel_values[B, 3, H, W]) -> last_hidden_state[B, 1 + N, D]`` as Hugging Face's
``Dinov2Model`` computes it: the patch embedding (a p x p convolution with stride p, ``PatchEmbed``),
the class token prepended and the learned position table resampled bicubically to the image's
grid (``Dinov2PositionEmbedding``; the table is the native 37 x 37 grid of 518 px, so a 224 px
image, 16 x 16 patches, is always a resampled one), the ``Dinov2Layer`` stack (pre-norm, LayerScale
on both branches), then the final ``layernorm``. N = (H / p) * (W / p), patches row by row.

Hugging Face's ``pooler_output`` is row 0 of ``last_hidden_state`` (the class token after the final
norm; there is no dense layer on it). It is not a second output here but
``Dinov2Model.pooler_output(last_hidden_state)``, a view of that row: the task scores the one tensor
every consumer reads (embedding services take the class row, dense-feature users the patch rows),
and a second output would score the same numbers twice.

Images must be whole patches: H and W multiples of the patch size. DINOv2's image processor hands
over 224 px crops and dense-feature pipelines crop to multiples of 14; otherwise a strided
convolution would drop the pixels past the last patch without a word. A wrong channel
count, a tensor that is not [B, C, H, W] and such sizes are refused with a ValueError naming the
model and what was wrong. Pixels are cast to the weights' dtype first, as Hugging Face does (image
processors return float32).

Parameter names follow Hugging Face's (``embeddings``, ``encoder.layer``, ``layernorm``) with the
children's own inside: ``embeddings.patch_embeddings.proj`` (timm's name for the projection),
``embeddings.position_embedding.{cls_token, position_embeddings}``, q/k/v fused per layer.
``load_weights`` / ``hf_state_dict`` take a Hugging Face ``Dinov2Model`` state dict (either layer
spelling, see ``hf_layer_state_dict``; a ``Dinov2ForImageClassification``'s ``dinov2.`` keys too);
the mask token (masked-image training only) and a classifier head are not part of this model.
SwiGLU MLPs (DINOv2-g) and register tokens (``Dinov2WithRegisters``, another model type) are not
served by this module and are refused.
"""
from typing import Any, Dict, Iterable, Set, Tuple

import torch
from torch import nn

from ..checkpoint import strip_prefixes
from ..L1.dinov2_embeddings import Dinov2PositionEmbedding, hf_embeddings_state_dict
from ..L1.layer_norm import LayerNorm
from ..L1.patch_embed import PatchEmbed, patch_grid
from ..L3.dinov2_layer import Dinov2Layer, hf_layer_state_dict
from ..model_config import _getter
from ..native import LayerStack, run
from ..records import RecordsInit

_HF_PREFIXES = ("dinov2.",)  # Dinov2ForImageClassification keeps the backbone under it
_NOT_OURS = ("embeddings.mask_token", "classifier.")  # masked-image training's token, a task head


class Dinov2Embeddings(RecordsInit, nn.Module):
    def __init__(self, hidden_size: int, image_size: int, patch_size: int, num_channels: int = 3):
        super().__init__()
        self.patch_embeddings = PatchEmbed(img_size=image_size, patch_size=patch_size, in_chans=num_channels,
                                           embed_dim=hidden_size)
        self.position_embedding = Dinov2PositionEmbedding(hidden_size, image_size, patch_size)
        self.patch_size, self.num_channels = patch_size, num_channels

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self._forward(pixel_values, native=False)

    def forward_native(self, pixel_values):
        return self._forward(pixel_values, native=True)

    def _forward(self, pixel_values, native):
        grid_height, grid_width = patch_grid(pixel_values, self.patch_size, self.num_channels, type(self).__name__)
        tokens = run(self.patch_embeddings, native, pixel_values)
        return run(self.position_embedding, native, tokens, grid_height, grid_width)


class Dinov2Encoder(RecordsInit, LayerStack, nn.Module):
    def __init__(self, hidden_size, num_attention_heads, num_hidden_layers, mlp_ratio, layer_norm_eps, hidden_act,
                 layerscale_value):
        super().__init__()
        self.layer = nn.ModuleList(
            Dinov2Layer(hidden_size, num_attention_heads, mlp_ratio, layer_norm_eps, hidden_act, layerscale_value)
            for _ in range(num_hidden_layers))


class Dinov2Model(RecordsInit, nn.Module):
    def __init__(self, config: Any):
        """``config``: a ``Dinov2Config`` (object or dict, e.g. tasks/configs/dinov2-small.json)."""
        super().__init__()
        get = _getter(config)
        if get("use_swiglu_ffn", False):
            raise ValueError("Dinov2Model: the SwiGLU MLP (use_swiglu_ffn, DINOv2-g) is not served by this module")
        if get("num_register_tokens", 0):
            raise ValueError("Dinov2Model: register tokens are Dinov2WithRegistersModel's, not served here")
        hidden, eps = get("hidden_size"), get("layer_norm_eps", 1e-6)
        self.num_hidden_layers = get("num_hidden_layers")
        self.num_channels, self.patch_size = get("num_channels", 3), get("patch_size", 14)
        self.embeddings = Dinov2Embeddings(hidden, get("image_size", 518), self.patch_size, self.num_channels)
        self.encoder = Dinov2Encoder(hidden, get("num_attention_heads"), self.num_hidden_layers,
                                     get("mlp_ratio", 4), eps, get("hidden_act", "gelu"),
                                     get("layerscale_value", 1.0))
        self.layernorm = LayerNorm(hidden, eps=eps)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self._forward(pixel_values, native=False)

    def forward_native(self, pixel_values):
        return self._forward(pixel_values, native=True)

    def _forward(self, pixel_values, native):
        self.check_pixel_values(pixel_values)
        pixel_values = pixel_values.to(self.layernorm.weight.dtype)
        hidden_states = run(self.encoder, native, run(self.embeddings, native, pixel_values))
        return run(self.layernorm, native, hidden_states)

    def check_pixel_values(self, pixel_values: torch.Tensor) -> None:
        """ValueError unless ``pixel_values`` is [B, C, H, W] with this model's C and whole patches."""
        shape, c, p = tuple(pixel_values.shape), self.num_channels, self.patch_size
        if pixel_values.dim() != 4:
            raise ValueError(f"Dinov2Model expects pixel_values [B, {c}, H, W]; got a {pixel_values.dim()}-D "
                             f"tensor of shape {shape}")
        if shape[1] != c:
            raise ValueError(f"Dinov2Model takes {c}-channel images; got {shape[1]} channels (shape {shape})")
        h, w = shape[2:]
        if h % p or w % p or not h or not w:
            raise ValueError(f"Dinov2Model: a {h}x{w} image is not a whole number of {p}x{p} patches; crop or "
                             f"resize it to multiples of {p} (e.g. 224x224) before the model")

    @staticmethod
    def pooler_output(last_hidden_state: torch.Tensor) -> torch.Tensor:
        """Hugging Face's ``pooler_output``: the class token's row after the final norm, [B, D] (a view)."""
        return last_hidden_state[:, 0]

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> None:
        """Hugging Face ``Dinov2Model`` tensors into place (cast to this model's dtype). Every parameter
        must be delivered with its shape, and every delivered tensor must find a place (the mask token
        and a classifier head excepted): a KeyError / RuntimeError names what did not."""
        state = _ReadRecorder(strip_prefixes(dict(weights), _HF_PREFIXES))
        ours = hf_state_dict(state, self.num_hidden_layers)
        unused = sorted(name for name in state if name not in state.read and not name.startswith(_NOT_OURS))
        if unused:
            raise KeyError(f"Dinov2Model: checkpoint tensors with no place in the model: {unused[:8]}")
        self.load_state_dict(ours, strict=True)


class _ReadRecorder(dict):
    """A state dict that remembers which names were read, so names nobody read can be reported."""

    def __init__(self, *args):
        super().__init__(*args)
        self.read: Set[str] = set()

    def __getitem__(self, name):
        self.read.add(name)
        return super().__getitem__(name)


def hf_state_dict(hf_state: Dict[str, torch.Tensor], num_hidden_layers: int) -> Dict[str, torch.Tensor]:
    """A ``Dinov2Model`` state dict from a Hugging Face one: the projection conv as ``PatchEmbed``'s
    ``proj``, class token and position table into ``embeddings.position_embedding``, each layer
    through ``hf_layer_state_dict``, the final norm as it is. (``dinov2.`` prefixes: strip them first,
    or use ``Dinov2Model.load_weights``.)"""
    ours = {f"embeddings.patch_embeddings.proj.{p}": hf_state[f"embeddings.patch_embeddings.projection.{p}"]
            for p in ("weight", "bias")}
    ours.update({f"embeddings.position_embedding.{k}": v for k, v in hf_embeddings_state_dict(hf_state).items()})
    for i in range(num_hidden_layers):
        layer = hf_layer_state_dict(hf_state, f"encoder.layer.{i}.")
        ours.update({f"encoder.layer.{i}.{k}": v for k, v in layer.items()})
    ours.update({f"layernorm.{p}": hf_state[f"layernorm.{p}"] for p in ("weight", "bias")})
    return ours
