# WRONG: the embedding head's L2 normalisation is skipped (pooled vectors returned as they are).
from kernels_reference.L1.pooler import Pooler as _Ref


class Pooler(_Ref):
    def forward(self, hidden_states, prompt_lens):
        normalize, self.normalize = self.normalize, False
        try:
            return self.forward_native(hidden_states, prompt_lens)
        finally:
            self.normalize = normalize
