"""DINOv3ViTModel: a DINOv3 image encoder, normalised pixels in, the class, register and patch tokens out.

``forward(pixel_values[B, 3, H, W]) -> last_hidden_state[B, 1 + R + N, D]`` as Hugging Face's
``DINOv3ViTModel`` computes it: the patch embedding (a p x p convolution with stride p,
``PatchEmbed``), the class token and the R register tokens put in front of the patch tokens (in that
order; no position table is added), the ``DINOv3ViTLayer`` stack (pre-norm, LayerScale on both
branches, the 2-D rotary embedding of the patch grid on every layer's q and k), then the final
``norm``. N = (H // p) * (W // p), patches row by row. DINOv3 ViT-L/16: R = 4, so a 224 px image is
1 + 4 + 196 = 201 tokens of width 1024.

Any image size runs: the rotation is computed from the grid (each axis normalised by its own patch
count), so there is nothing to resample. Pixels past the last whole patch are not read, as Hugging
Face's convolution and its rotary grid (``H // p``) leave them; an image smaller than one patch, a
wrong channel count or a tensor that is not [B, C, H, W] is refused with a ValueError. Pixels are cast
to the weights' dtype first, as Hugging Face does (image processors return float32).

Hugging Face's ``pooler_output`` is row 0 of ``last_hidden_state`` (the class token after the final
norm): ``pooler_output(...)`` here, a view of that row, not a second output the task would score twice.
Consumers read the class row (embeddings) or the patch rows ``[:, 1 + R:]`` (dense features).

Parameter names follow Hugging Face's (``embeddings.{cls_token, register_tokens}``, ``model.layer``,
``norm``) with the children's own inside: ``embeddings.patch_embeddings.proj`` (timm's name for the
projection), q/k/v fused per layer. ``load_weights`` / ``hf_state_dict`` take a Hugging Face
``DINOv3ViTModel`` state dict; the mask token (masked-image training only) is not part of this model.
"""
from typing import Any, Dict, Iterable, Tuple

import torch
from torch import nn

from ..L1.layer_norm import LayerNorm
from ..L1.patch_embed import PatchEmbed, patch_grid
from ..L3.dinov3_layer import DINOv3ViTArchConfig, DINOv3ViTLayer, hf_layer_state_dict
from ..native import run
from ..records import RecordsInit

_NOT_OURS = ("embeddings.mask_token",)  # masked-image training's token


class DINOv3ViTEmbeddings(RecordsInit, nn.Module):
    def __init__(self, hidden_size: int, patch_size: int, image_size: int = 224, num_channels: int = 3,
                 num_register_tokens: int = 0):
        super().__init__()
        self.patch_embeddings = PatchEmbed(img_size=image_size, patch_size=patch_size, in_chans=num_channels,
                                           embed_dim=hidden_size)
        self.cls_token = nn.Parameter(torch.empty(1, 1, hidden_size))
        self.register_tokens = nn.Parameter(torch.empty(1, num_register_tokens, hidden_size))

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self._forward(pixel_values, native=False)

    def forward_native(self, pixel_values):
        return self._forward(pixel_values, native=True)

    def _forward(self, pixel_values, native):
        patches = run(self.patch_embeddings, native, pixel_values)
        batch, dt = patches.shape[0], patches.dtype
        prefix = torch.cat([self.cls_token, self.register_tokens], dim=1).to(dt).expand(batch, -1, -1)
        return torch.cat([prefix, patches], dim=1)


class DINOv3ViTEncoder(RecordsInit, nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        cfg = DINOv3ViTArchConfig.from_hf(config)
        self.layer = nn.ModuleList(DINOv3ViTLayer(config) for _ in range(cfg.num_hidden_layers))

    def forward(self, hidden_states: torch.Tensor, grid_height: int, grid_width: int) -> torch.Tensor:
        return self._forward(hidden_states, grid_height, grid_width, native=False)

    def forward_native(self, hidden_states, grid_height, grid_width):
        return self._forward(hidden_states, grid_height, grid_width, native=True)

    def _forward(self, hidden_states, grid_height, grid_width, native):
        for layer in self.layer:
            hidden_states = run(layer, native, hidden_states, grid_height, grid_width)
        return hidden_states


class DINOv3ViTModel(RecordsInit, nn.Module):
    def __init__(self, config: Any):
        """``config``: a ``DINOv3ViTConfig`` (object or dict, e.g. tasks/configs/dinov3-vitl16.json)."""
        super().__init__()
        cfg = DINOv3ViTArchConfig.from_hf(config)
        self.num_hidden_layers, self.num_channels, self.patch_size = cfg.num_hidden_layers, cfg.num_channels, cfg.patch_size
        self.num_prefix_tokens = cfg.num_prefix_tokens
        self.embeddings = DINOv3ViTEmbeddings(cfg.hidden_size, cfg.patch_size, cfg.image_size, cfg.num_channels,
                                              cfg.num_register_tokens)
        self.model = DINOv3ViTEncoder(config)
        self.norm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self._forward(pixel_values, native=False)

    def forward_native(self, pixel_values):
        return self._forward(pixel_values, native=True)

    def _forward(self, pixel_values, native):
        grid_height, grid_width = self.patch_grid(pixel_values)
        pixel_values = pixel_values.to(self.norm.weight.dtype)
        tokens = run(self.embeddings, native, pixel_values)
        return run(self.norm, native, run(self.model, native, tokens, grid_height, grid_width))

    def patch_grid(self, pixel_values: torch.Tensor) -> Tuple[int, int]:
        """(rows, columns) of whole patches; ValueError unless ``pixel_values`` is [B, C, H, W] with this
        model's C and at least one patch."""
        shape, c = tuple(pixel_values.shape), self.num_channels
        if pixel_values.dim() != 4 or shape[1] != c:
            raise ValueError(f"DINOv3ViTModel expects pixel_values [B, {c}, H, W]; got shape {shape}")
        return patch_grid(pixel_values, self.patch_size, c, type(self).__name__)

    @staticmethod
    def pooler_output(last_hidden_state: torch.Tensor) -> torch.Tensor:
        """Hugging Face's ``pooler_output``: the class token's row after the final norm, [B, D] (a view)."""
        return last_hidden_state[:, 0]

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> None:
        """Hugging Face ``DINOv3ViTModel`` tensors into place (cast to this model's dtype). Every
        parameter must be delivered with its shape (RuntimeError otherwise) and every delivered tensor
        must find a place, the mask token excepted (KeyError naming the ones that did not)."""
        state = dict(weights)
        ours = hf_state_dict(state, self.num_hidden_layers)
        read = set(_hf_names(state, self.num_hidden_layers))
        unused = sorted(n for n in state if n not in read and not n.startswith(_NOT_OURS))
        if unused:
            raise KeyError(f"DINOv3ViTModel: checkpoint tensors with no place in the model: {unused[:8]}")
        self.load_state_dict(ours, strict=True)


def pooler_output(last_hidden_state: torch.Tensor) -> torch.Tensor:
    return DINOv3ViTModel.pooler_output(last_hidden_state)


# a Hugging Face DINOv3ViTLayer's tensors (either MLP; biases the config may leave out)
_HF_LAYER_NAMES = tuple(f"{m}.{p}" for p in ("weight", "bias") for m in (
    "norm1", "norm2", "attention.q_proj", "attention.k_proj", "attention.v_proj", "attention.o_proj",
    "mlp.up_proj", "mlp.down_proj", "mlp.gate_proj")) + ("layer_scale1.lambda1", "layer_scale2.lambda1")


def _hf_names(hf_state: Dict[str, torch.Tensor], num_hidden_layers: int):
    """The Hugging Face names ``hf_state_dict`` reads: the embeddings', the final norm's and every
    layer's."""
    known = {"embeddings.cls_token", "embeddings.register_tokens", "embeddings.patch_embeddings.weight",
             "embeddings.patch_embeddings.bias", "norm.weight", "norm.bias"}
    known.update(f"model.layer.{i}.{n}" for i in range(num_hidden_layers) for n in _HF_LAYER_NAMES)
    return [n for n in hf_state if n in known]


def hf_state_dict(hf_state: Dict[str, torch.Tensor], num_hidden_layers: int) -> Dict[str, torch.Tensor]:
    """A ``DINOv3ViTModel`` state dict from a Hugging Face one: the projection conv as ``PatchEmbed``'s
    ``proj``, the class and register tokens as they are, each layer through ``hf_layer_state_dict``,
    the final norm as it is."""
    ours = {f"embeddings.patch_embeddings.proj.{p}": hf_state[f"embeddings.patch_embeddings.{p}"]
            for p in ("weight", "bias")}
    for name in ("cls_token", "register_tokens"):
        ours[f"embeddings.{name}"] = hf_state[f"embeddings.{name}"]
    for i in range(num_hidden_layers):
        layer = hf_layer_state_dict(hf_state, f"model.layer.{i}.")
        ours.update({f"model.layer.{i}.{k}": v for k, v in layer.items()})
    ours.update({f"norm.{p}": hf_state[f"norm.{p}"] for p in ("weight", "bias")})
    return ours
