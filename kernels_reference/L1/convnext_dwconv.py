"""The first half of a ConvNeXt block: 7x7 depthwise convolution, then LayerNorm over channels.

timm's ``ConvNeXtBlock`` (ConvNeXt and ConvNeXt-V2, ``conv_mlp=False``) and Hugging Face's
``ConvNextV2Layer`` both run ``conv_dw`` (``Conv2d(C, C, 7, padding=3, groups=C)`` with a bias: each
channel filtered by its own 7x7 kernel, zero padding, the same spatial size out), then
``permute(0, 2, 3, 1)`` to channels-last and a ``LayerNorm(C, eps=1e-6)`` over the channels of
each pixel; the MLP after it reads that channels-last tensor. This module is that pair with timm's
parameter names (``conv_dw.weight`` [C, 1, 7, 7], ``conv_dw.bias``, ``norm.weight``,
``norm.bias``); HF's ``dwconv`` / ``layernorm`` keys map by renaming.

``forward(x [B, C, H, W]) -> [B, H, W, C]``: the input may be contiguous (NCHW) or in torch's
channels-last memory format (a model moved with ``.to(memory_format=torch.channels_last)``, the
usual way to serve convnets on GPUs); the output is a packed ``[B, H, W, C]`` tensor either way.

Semantics (``forward_native``): the convolution, written out tap by tap (``depthwise_conv_taps``),
in float32 for half types (float64 stays float64: the correctness truth), rounded to the activation dtype as the convolution's output is in
production, then the LayerNorm (statistics in float32, one rounding), as ``L1/layer_norm.py``.

The fast path on CUDA is what production runs: cuDNN's depthwise convolution on the input in the
memory format it comes in, then the suite's ``LayerNorm`` module, whose CUDA path is its Triton row
kernel. A channels-last output permuted to ``[B, H, W, C]`` is a packed view, so nothing is copied;
an NCHW one is packed for the row kernel. Converting an NCHW input to channels-last first (as this
path once did, for cuDNN's NHWC depthwise kernels) cost a copy that the faster kernel did not win
back: 18.5 us against 12.8 us for timm's NCHW sequence on one 768 x 7 x 7 map and 20.1 against 17.2
on a 192 x 28 x 28 one (H200, 2026-12-05, ``python3 -m fk_pytest.peers --device cuda --profile full
--ops convnext_dwconv_norm``). The LayerNorm is the module the ``layer_norm`` task scores
and times against ``F.layer_norm``; using it here keeps one LayerNorm implementation in the
reference, and a block built of these modules runs the same kernel as this task.
"""
import torch
import torch.nn.functional as F
from torch import nn

from ..dispatch import compute_dtype
from ..records import RecordsInit
from .layer_norm import LayerNorm


class ConvNeXtDwConvNorm(RecordsInit, nn.Module):
    def __init__(self, dim: int, kernel_size: int = 7, eps: float = 1e-6, conv_bias: bool = True):
        super().__init__()
        if kernel_size % 2 != 1:
            raise ValueError(f"ConvNeXtDwConvNorm needs an odd kernel (same-size padding), got {kernel_size}")
        self.dim, self.kernel_size = dim, kernel_size
        self.conv_dw = nn.Conv2d(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim, bias=conv_bias)
        self.norm = LayerNorm(dim, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [B, C, H, W] (any memory format) -> [B, H, W, C], packed."""
        self._check(x)
        # cuDNN under torch.compile too: Inductor leaves convolutions to cuDNN.
        if x.is_cuda:
            return self.forward_cudnn(x)
        return self.forward_native(x)

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        self._check(x)
        y = depthwise_conv_taps(x, self.conv_dw.weight, self.conv_dw.bias)
        return self.norm.forward_native(y.to(x.dtype).permute(0, 2, 3, 1).contiguous())

    def forward_cudnn(self, x: torch.Tensor) -> torch.Tensor:
        if not (x.is_contiguous() or x.is_contiguous(memory_format=torch.channels_last)):
            x = x.contiguous()
        y = F.conv2d(x, self.conv_dw.weight.to(x.dtype),
                     self.conv_dw.bias.to(x.dtype) if self.conv_dw.bias is not None else None,
                     padding=self.kernel_size // 2, groups=self.dim)
        y = y.permute(0, 2, 3, 1)
        if not y.is_contiguous():  # an NCHW output: pack it for the row kernel
            y = y.contiguous()
        return self.norm(y)

    def _check(self, x: torch.Tensor) -> None:
        if x.dim() != 4 or x.shape[1] != self.dim:
            raise ValueError(f"ConvNeXtDwConvNorm({self.dim}) expects [B, {self.dim}, H, W], got {tuple(x.shape)}")

    def extra_repr(self) -> str:
        return f"{self.dim}, kernel_size={self.kernel_size}"


def depthwise_conv_taps(x: torch.Tensor, weight: torch.Tensor, bias) -> torch.Tensor:
    """``Conv2d(C, C, k, padding=k // 2, groups=C)`` written out: the bias plus, for every tap
    (i, j), the zero-padded map shifted by (i, j) times that tap's per-channel weight (a
    cross-correlation, as every framework's conv is), in float32 for half types and float64 for
    float64. Spelled out because the float64 truth through ``F.conv2d`` takes torch's generic CPU
    path for grouped convolutions, seconds a call at ConvNeXt's widths."""
    dt = compute_dtype(x.dtype)
    channels, _, k, _ = weight.shape
    height, width = x.shape[2:]
    padded = F.pad(x.to(dt), (k // 2,) * 4)
    taps = weight.to(dt).reshape(channels, k, k)
    out = torch.zeros(x.shape, dtype=dt, device=x.device)
    if bias is not None:
        out += bias.to(dt).view(1, channels, 1, 1)
    for i in range(k):
        for j in range(k):
            out += padded[:, :, i:i + height, j:j + width] * taps[:, i, j].view(1, channels, 1, 1)
    return out
