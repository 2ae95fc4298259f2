# WRONG: chunks do not pass their state on: each chunk of a sequence starts from zero (the first
# from the sequence's initial state), so only sequences of at most one chunk come out right.
import torch
from kernels_reference.L1.mamba_chunk_scan import MambaChunkScanCombined as _Ref


class MambaChunkScanCombined(_Ref):
    def forward(self, x, dt, A, B, C, cu_seqlens, D=None, z=None, dt_bias=None, initial_states=None):
        bounds, pieces, owner = cu_seqlens.tolist(), [0], []
        for seq, (a, b) in enumerate(zip(bounds, bounds[1:])):
            starts = list(range(a, b, self.chunk_size)) or [a]
            pieces += [min(s + self.chunk_size, b) for s in starts]
            owner += [seq] * len(starts)
        shape = (len(owner), *x.shape[1:], B.shape[-1])
        init = torch.zeros(shape, dtype=torch.float32, device=x.device)
        if initial_states is not None:
            for i, seq in enumerate(owner):
                if i == 0 or owner[i - 1] != seq:  # a sequence's first chunk
                    init[i] = initial_states[seq]
        cu = torch.tensor(pieces, dtype=torch.int32, device=x.device)
        y, states = self.forward_native(x, dt, A, B, C, cu, D, z, dt_bias, init)
        last = [max(i for i, s in enumerate(owner) if s == seq) for seq in range(len(bounds) - 1)]
        return y, states[last]
