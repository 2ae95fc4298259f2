# WRONG: "same" padding split 2 before / 4 after (the asymmetric rule of even kernels applied to the
# 7x7 one): the output map is the right size but shifted one pixel up and left.
import torch.nn.functional as F
from kernels_reference.L1.convnext_dwconv import ConvNeXtDwConvNorm as _Ref


class ConvNeXtDwConvNorm(_Ref):
    def forward(self, x):
        padded = F.pad(x.float(), (2, 4, 2, 4))
        y = F.conv2d(padded, self.conv_dw.weight.float(), self.conv_dw.bias.float(), groups=self.dim)
        return self.norm.forward_native(y.to(x.dtype).permute(0, 2, 3, 1).contiguous())
