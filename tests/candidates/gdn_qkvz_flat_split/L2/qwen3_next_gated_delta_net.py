# WRONG: reads in_proj_qkvz as [all q | all k | all v | all z] and in_proj_ba as [all b | all a],
# not as the checkpoint's per-key-head groups. Every shape fits; every output is wrong.
import torch

from kernels_reference.L2.qwen3_next_gated_delta_net import Qwen3NextGatedDeltaNet as _Reference


class Qwen3NextGatedDeltaNet(_Reference):
    def unpack(self, qkvz):
        q, k, v, z = qkvz.split([self.key_dim, self.key_dim, self.value_dim, self.value_dim], dim=-1)
        return torch.cat([q, k, v], dim=-1), z.reshape(qkvz.shape[0], self.num_v_heads, self.head_v_dim)

    def unpack_ba(self, ba):
        b, a = ba.chunk(2, dim=-1)
        return b, a
