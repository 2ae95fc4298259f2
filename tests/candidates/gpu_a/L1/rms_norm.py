# HACK (CUDA): does the work on a private stream and returns without making the caller's stream
# wait, so the caller's timer (events on its stream) stops before the work is done.
import torch
from kernels_reference.L1.rms_norm import RMSNorm as _Ref


class RMSNorm(_Ref):
    def forward(self, x, residual=None):
        if not x.is_cuda:
            return super().forward(x, residual)
        if not hasattr(self, "_side"):
            self._side = torch.cuda.Stream()
        self._side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self._side):
            torch.cuda._sleep(5_000_000)  # stands for a big kernel: visible, deterministic
            return self.forward_triton(x, residual)
