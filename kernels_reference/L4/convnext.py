"""ConvNextV2Model: ConvNeXt-V2 as an image encoder, normalised pixels in, the last stage's feature
map and the pooled, normalised image embedding out.

``forward(pixel_values [B, 3, H, W]) -> (last_hidden_state [B, C4, H/32, W/32], pooler_output [B, C4])``,
Hugging Face's ``ConvNextV2Model`` outputs (timm's ``forward_features`` and ``forward_head(...,
pre_logits=True)``). The network:

* stem: a 4x4 convolution of stride 4 (``patch_size``), then LayerNorm over channels;
* four stages of ``ConvNeXtBlock``s at ``hidden_sizes`` channels; stages 2-4 open with a
  downsampling layer, LayerNorm over channels then a 2x2 convolution of stride 2 (widths double,
  sides halve, rounding down);
* head: the global average over the last map, then LayerNorm (``layer_norm_eps``).

ConvNeXt-V2-Tiny at 224 px runs stages of 56, 28, 14 and 7 pixels a side at 96, 192, 384 and 768
channels. Every LayerNorm but the head's has eps 1e-6 in both libraries; the head's is the config's
``layer_norm_eps`` (timm's ``head.norm`` has 1e-6, HF's converted checkpoints say 1e-12: on pooled
features of unit variance the two differ by about 5e-7 relatively, within float32's rounding bar).

The stem and the downsampling convolutions do not overlap (kernel = stride), so each is the suite's
``PatchEmbed`` (one GEMM over gathered patches on the GPU in half types); its tokens, in raster
order, are the output map in channels-last layout, which the LayerNorm reads as rows. The feature
maps are logically NCHW, in channels-last memory after the stem, as timm and HF produce them (see
``L3/convnext_block.py``); ``last_hidden_state`` keeps that memory format.

Parameter names follow timm's module tree (``stem``, ``stages.i.downsample``, ``stages.i.blocks.j``,
the head's norm as ``head_norm``) with the suite's modules inside; ``timm_state_dict`` and
``hf_state_dict`` map the two libraries' checkpoints onto them (the classifier is not read).
"""
from typing import Any, Dict, Optional, Tuple

import torch
from torch import nn

from ..checkpoint import strip_prefixes
from ..dispatch import compute_dtype
from ..L1.layer_norm import LayerNorm
from ..L1.patch_embed import PatchEmbed
from ..L3.convnext_block import ConvNeXtBlock, hf_layer_state_dict, timm_block_state_dict
from ..model_config import _getter
from ..native import run
from ..records import RecordsInit

BLOCK_EPS = 1e-6  # the stem's, the downsampling layers' and the blocks' LayerNorms (fixed in timm and HF)
_HF_PREFIXES = ("convnextv2.",)  # ConvNextV2ForImageClassification keeps the model under it


def _patchify(conv: PatchEmbed, stride: int, x: torch.Tensor, native: bool) -> torch.Tensor:
    """The non-overlapping ``stride`` x ``stride`` convolution of ``x`` [B, C, H, W] as
    [B, H // stride, W // stride, D], channels-last. Only ``conv``'s forward is called (in composed
    mode it may be a candidate's PatchEmbed)."""
    tokens = run(conv, native, x)  # [B, Hp * Wp, D], raster order
    return tokens.reshape(x.shape[0], x.shape[2] // stride, x.shape[3] // stride, tokens.shape[-1])


class ConvNeXtStem(RecordsInit, nn.Module):
    def __init__(self, in_chans: int, out_chs: int, patch_size: int = 4, eps: float = BLOCK_EPS):
        super().__init__()
        self.patch_size = patch_size
        self.conv = PatchEmbed(patch_size=patch_size, in_chans=in_chans, embed_dim=out_chs)
        self.norm = LayerNorm(out_chs, eps=eps)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self._forward(pixel_values, native=False)

    def forward_native(self, pixel_values):
        return self._forward(pixel_values, native=True)

    def _forward(self, pixel_values, native):
        maps = _patchify(self.conv, self.patch_size, pixel_values, native)
        return run(self.norm, native, maps).permute(0, 3, 1, 2)


class ConvNeXtDownsample(RecordsInit, nn.Module):
    """LayerNorm over channels, then the 2x2 stride-2 convolution to the next stage's width."""

    def __init__(self, in_chs: int, out_chs: int, stride: int = 2, eps: float = BLOCK_EPS):
        super().__init__()
        self.stride = stride
        self.norm = LayerNorm(in_chs, eps=eps)
        self.conv = PatchEmbed(patch_size=stride, in_chans=in_chs, embed_dim=out_chs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._forward(x, native=False)

    def forward_native(self, x):
        return self._forward(x, native=True)

    def _forward(self, x, native):
        normed = run(self.norm, native, x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return _patchify(self.conv, self.stride, normed, native).permute(0, 3, 1, 2)


class ConvNeXtStage(RecordsInit, nn.Module):
    def __init__(self, in_chs: int, out_chs: int, depth: int, stride: int = 2, kernel_size: int = 7,
                 mlp_ratio: float = 4):
        super().__init__()
        # timm: an Identity for the first stage, whose width the stem already has
        self.downsample: Optional[ConvNeXtDownsample] = (
            ConvNeXtDownsample(in_chs, out_chs, stride) if stride > 1 or in_chs != out_chs else None)
        self.blocks = nn.ModuleList(
            ConvNeXtBlock(out_chs, kernel_size=kernel_size, mlp_ratio=mlp_ratio, eps=BLOCK_EPS) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._forward(x, native=False)

    def forward_native(self, x):
        return self._forward(x, native=True)

    def _forward(self, x, native):
        if self.downsample is not None:
            x = run(self.downsample, native, x)
        for block in self.blocks:
            x = run(block, native, x)
        return x


class ConvNextV2Model(RecordsInit, nn.Module):
    def __init__(self, config: Any):
        """``config``: a ``ConvNextV2Config`` (object or dict, e.g. tasks/configs' convnextv2-tiny)."""
        super().__init__()
        get = _getter(config)
        dims, depths = list(get("hidden_sizes")), list(get("depths"))
        if len(dims) != len(depths):
            raise ValueError(f"ConvNextV2Model: {len(dims)} hidden_sizes for {len(depths)} stages of depths")
        if get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"ConvNextV2Model runs the exact GELU, the config asks for {get('hidden_act')!r}")
        kernel, ratio = get("kernel_size", 7), get("mlp_ratio", 4)
        self.stem = ConvNeXtStem(get("num_channels", 3), dims[0], get("patch_size", 4))
        self.stages = nn.ModuleList(
            ConvNeXtStage(dims[max(i - 1, 0)], dims[i], depths[i], stride=1 if i == 0 else 2, kernel_size=kernel,
                          mlp_ratio=ratio) for i in range(len(dims)))
        self.head_norm = LayerNorm(dims[-1], eps=get("layer_norm_eps", 1e-12))

    def forward(self, pixel_values: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return self._forward(pixel_values, native=False)

    def forward_native(self, pixel_values):
        return self._forward(pixel_values, native=True)

    def _forward(self, pixel_values, native):
        x = run(self.stem, native, pixel_values)
        for stage in self.stages:
            x = run(stage, native, x)
        # the average in float32 for half types, rounded to the activation dtype as the pooling's output is
        pooled = x.mean(dim=(2, 3), dtype=compute_dtype(x.dtype)).to(x.dtype)
        return x, run(self.head_norm, native, pooled)


def _parts(state: Dict[str, torch.Tensor], theirs: str, ours: str) -> Dict[str, torch.Tensor]:
    return {f"{ours}.{p}": state[f"{theirs}.{p}"] for p in ("weight", "bias")}


def hf_state_dict(hf_state: Dict[str, torch.Tensor], depths) -> Dict[str, torch.Tensor]:
    """A ``ConvNextV2Model`` state dict from a Hugging Face one (``ConvNextV2Model``'s keys, or a
    ``ConvNextV2ForImageClassification`` checkpoint's ``convnextv2.`` ones; the classifier is not read)."""
    return _renamed(strip_prefixes(hf_state, _HF_PREFIXES), depths, _HF_NAMES, hf_layer_state_dict)


def timm_state_dict(timm_state: Dict[str, torch.Tensor], depths) -> Dict[str, torch.Tensor]:
    """A ``ConvNextV2Model`` state dict from a timm ``ConvNeXt`` one (``stem.0`` / ``stem.1``,
    ``stages.i.downsample.0`` / ``.1``, ``stages.i.blocks.j``, ``head.norm``; ``head.fc`` not read)."""
    return _renamed(timm_state, depths, _TIMM_NAMES, timm_block_state_dict)


# Where each library keeps the model's parts: (stem conv, stem norm, head norm, stage i's
# downsampling norm and conv, block j of stage i), ours in the same order in _renamed.
_HF_NAMES = ("embeddings.patch_embeddings", "embeddings.layernorm", "layernorm",
             lambda i: f"encoder.stages.{i}.downsampling_layer.0", lambda i: f"encoder.stages.{i}.downsampling_layer.1",
             lambda i, j: f"encoder.stages.{i}.layers.{j}.")
_TIMM_NAMES = ("stem.0", "stem.1", "head.norm", lambda i: f"stages.{i}.downsample.0",
               lambda i: f"stages.{i}.downsample.1", lambda i, j: f"stages.{i}.blocks.{j}.")


def _renamed(state, depths, names, block_state_dict) -> Dict[str, torch.Tensor]:
    stem_conv, stem_norm, head_norm, down_norm, down_conv, block = names
    ours = {**_parts(state, stem_conv, "stem.conv.proj"), **_parts(state, stem_norm, "stem.norm"),
            **_parts(state, head_norm, "head_norm")}
    for i, depth in enumerate(depths):
        if i > 0:
            ours.update(_parts(state, down_norm(i), f"stages.{i}.downsample.norm"))
            ours.update(_parts(state, down_conv(i), f"stages.{i}.downsample.conv.proj"))
        for j in range(depth):
            ours.update({f"stages.{i}.blocks.{j}.{k}": v for k, v in block_state_dict(state, block(i, j)).items()})
    return ours
