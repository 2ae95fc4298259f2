"""ConvNeXtBlock: ConvNeXt-V2's residual block, feature maps [B, C, H, W] in and out.

``x + pwconv2(grn(gelu(pwconv1(norm(dwconv(x))))))``, the branch run channels-last: the 7x7
depthwise convolution, ``permute(0, 2, 3, 1)``, LayerNorm over the channels of each pixel (eps 1e-6),
the MLP (a 4x Linear, exact GELU, Global Response Normalization, the Linear back), ``permute(0, 3,
1, 2)``, then the residual add. No LayerScale (ConvNeXt-V2 dropped ConvNeXt's ``gamma``) and no
drop path (identity at inference).

Interface: timm's ``ConvNeXtBlock`` (``in_chs``, ``kernel_size``, ``mlp_ratio``, ``conv_bias``;
``forward(x)``), as timm builds ConvNeXt-V2 (``use_grn=True, ls_init_value=None, conv_mlp=False``)
and as Hugging Face's ``ConvNextV2Layer`` runs it. timm is the library convnets are served from, and
the suite's L1 conv modules already take its names; HF's layer is the same block under other names.

Parameter names: the suite's L1 module is the first half (``conv_dw_norm``: timm's ``conv_dw`` and
``norm`` inside it), so a candidate of the ``convnext_dwconv_norm`` task runs inside this block in
composed mode; the MLP is timm's ``mlp`` (``fc1``, ``grn``, ``fc2``). ``timm_block_state_dict`` and
``hf_layer_state_dict`` map the two libraries' keys onto these.

Layout: logically NCHW in and out, permuting inside, as timm's and HF's blocks do. In both libraries
every block's input is in channels-last *memory* (HF's ConvNextV2Model checked): the stem's
channels-first LayerNorm permutes, normalises rows and permutes back, a convolution of a
channels-last input keeps that layout, and a block's output is its channels-last branch permuted
back plus the shortcut. This module keeps that: the branch's rows are the pixels' channel vectors
(the GEMMs, GELU and GRN read packed rows), and the output is the branch plus the input, in
channels-last memory. A packed NCHW input is accepted too (the depthwise convolution takes either).

Numerics: each child's own (the convolution and LayerNorm in float32 with one rounding, the GEMMs,
GELU with pwconv1's bias fused and GRN in float32 with one rounding each); the residual add is one
rounding of the exact sum in the activation dtype, as ``branch + shortcut`` is in timm.
"""
from typing import Dict

import torch
import torch.nn.functional as F
from torch import nn

from ..L1.convnext_dwconv import ConvNeXtDwConvNorm
from ..L1.gelu import GELU
from ..L1.grn import GlobalResponseNorm
from ..L1.linear import ReplicatedLinear
from ..native import run
from ..records import RecordsInit


class GlobalResponseNormMlp(RecordsInit, nn.Module):
    """timm's MLP of ConvNeXt-V2 on channels-last rows: ``fc2(grn(gelu(fc1(x))))``.

    The Linears are replicated, never tensor-parallel: GRN divides by the mean over all hidden
    channels, which a column-sharded fc1 would leave split over ranks (and convnets are served
    whole on one GPU)."""

    def __init__(self, in_features: int, hidden_features: int):
        super().__init__()
        self.fc1 = ReplicatedLinear(in_features, hidden_features, bias=True)
        self.act = GELU("none")  # ConvNeXt-V2 uses the exact GELU (timm 'gelu', HF hidden_act "gelu")
        self.grn = GlobalResponseNorm(hidden_features, channels_last=True)
        self.fc2 = ReplicatedLinear(hidden_features, in_features, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._forward(x, native=False)

    def forward_native(self, x):
        return self._forward(x, native=True)

    def _forward(self, x, native):
        # fc1's bias goes into the activation (the GEMM's bias + GELU epilogue)
        up = F.linear(x, self.fc1.weight)
        return run(self.fc2, native, run(self.grn, native, run(self.act, native, up, self.fc1.bias)))


class ConvNeXtBlock(RecordsInit, nn.Module):
    def __init__(self, in_chs: int, kernel_size: int = 7, mlp_ratio: float = 4, conv_bias: bool = True,
                 eps: float = 1e-6):
        super().__init__()
        self.in_chs = in_chs
        self.conv_dw_norm = ConvNeXtDwConvNorm(in_chs, kernel_size=kernel_size, eps=eps, conv_bias=conv_bias)
        self.mlp = GlobalResponseNormMlp(in_chs, int(mlp_ratio * in_chs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [B, C, H, W] (either memory format) -> [B, C, H, W] in channels-last memory."""
        return self._forward(x, native=False)

    def forward_native(self, x):
        return self._forward(x, native=True)

    def _forward(self, x, native):
        branch = run(self.mlp, native, run(self.conv_dw_norm, native, x))  # [B, H, W, C], packed
        # The branch first: the sum takes its channels-last memory (timm's operand order).
        return branch.permute(0, 3, 1, 2) + x

    def extra_repr(self) -> str:
        return f"{self.in_chs}"


# timm's and Hugging Face's block keys -> ours (without the "weight" / "bias" suffix)
_TIMM_RENAMES = {"conv_dw": "conv_dw_norm.conv_dw", "norm": "conv_dw_norm.norm", "mlp.fc1": "mlp.fc1",
                 "mlp.grn": "mlp.grn", "mlp.fc2": "mlp.fc2"}
_HF_RENAMES = {"dwconv": "conv_dw_norm.conv_dw", "layernorm": "conv_dw_norm.norm", "pwconv1": "mlp.fc1",
               "grn": "mlp.grn", "pwconv2": "mlp.fc2"}


def _renamed(state: Dict[str, torch.Tensor], prefix: str, renames: Dict[str, str]) -> Dict[str, torch.Tensor]:
    return {f"{ours}.{part}": state[f"{prefix}{theirs}.{part}"]
            for theirs, ours in renames.items() for part in ("weight", "bias")}


def timm_block_state_dict(timm_state: Dict[str, torch.Tensor], prefix: str = "") -> Dict[str, torch.Tensor]:
    """A ``ConvNeXtBlock`` state dict from a timm one (``prefix``: e.g. ``stages.2.blocks.4.``)."""
    return _renamed(timm_state, prefix, _TIMM_RENAMES)


def hf_layer_state_dict(hf_state: Dict[str, torch.Tensor], prefix: str = "") -> Dict[str, torch.Tensor]:
    """A ``ConvNeXtBlock`` state dict from a Hugging Face ``ConvNextV2Layer`` one (``prefix``: e.g.
    ``encoder.stages.2.layers.4.``); HF's GRN parameters already have timm's [1, 1, 1, C] shape."""
    return _renamed(hf_state, prefix, _HF_RENAMES)
