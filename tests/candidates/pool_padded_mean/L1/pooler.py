# WRONG: the batch padded to its longest sequence with zero rows and averaged over that padded
# length, so every shorter sequence's mean is divided by the wrong count.
import torch
import torch.nn.functional as F

from kernels_reference.L1.pooler import Pooler as _Ref


class Pooler(_Ref):
    def forward(self, hidden_states, prompt_lens):
        if self.pooling_type != "MEAN":
            return self.forward_native(hidden_states, prompt_lens)
        seqs = hidden_states.float().split(prompt_lens.tolist())
        padded = torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True)  # [B, longest, H]
        pooled = padded.mean(dim=1)
        return F.normalize(pooled, dim=-1) if self.normalize else pooled
