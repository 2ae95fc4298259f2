# WRONG: CLS pooling takes each sequence's last row instead of its first (the two ends swapped,
# as if the batch were left-padded for a decoder).
import torch.nn.functional as F

from kernels_reference.L1.pooler import Pooler as _Ref


class Pooler(_Ref):
    def forward(self, hidden_states, prompt_lens):
        if self.pooling_type != "CLS":
            return self.forward_native(hidden_states, prompt_lens)
        pooled = hidden_states[prompt_lens.long().cumsum(0) - 1].float()
        return F.normalize(pooled, dim=-1) if self.normalize else pooled
