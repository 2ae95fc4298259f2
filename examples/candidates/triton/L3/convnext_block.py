"""ConvNeXtBlock from this tree's modules: the depthwise conv + LayerNorm (channels-last rows out),
fc1 as one GEMM over the pixels, the Triton GELU with fc1's bias fused, the Triton GRN, fc2 with its
bias, then the input plus the branch viewed back as [B, C, H, W]."""
import torch
from torch import nn

from ..L1.convnext_dwconv import ConvNeXtDwConvNorm
from ..L1.gelu import GELU
from ..L1.grn import GlobalResponseNorm
from ..L1.linear import ReplicatedLinear


class _GrnMlp(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = ReplicatedLinear(dim, hidden, bias=True)
        self.act = GELU("none")
        self.grn = GlobalResponseNorm(hidden)
        self.fc2 = ReplicatedLinear(hidden, dim, bias=True)

    def forward(self, maps):
        b, h, w, c = maps.shape
        up = torch.mm(maps.reshape(b * h * w, c), self.fc1.weight.t())  # the bias goes into the GELU
        hidden = self.act(up, self.fc1.bias).view(b, h, w, -1)
        return self.fc2(self.grn(hidden))


class ConvNeXtBlock(nn.Module):
    def __init__(self, in_chs, kernel_size=7, mlp_ratio=4, conv_bias=True, eps=1e-6):
        super().__init__()
        self.conv_dw_norm = ConvNeXtDwConvNorm(in_chs, kernel_size=kernel_size, eps=eps, conv_bias=conv_bias)
        self.mlp = _GrnMlp(in_chs, int(mlp_ratio * in_chs))

    def forward(self, x):
        branch = self.mlp(self.conv_dw_norm(x))  # [B, H, W, C]
        return x + branch.permute(0, 3, 1, 2)
