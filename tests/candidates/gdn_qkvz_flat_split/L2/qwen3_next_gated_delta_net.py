# WRONG: reads in_proj_qkvz as [all q | all k | all v | all z] and in_proj_ba as [all b | all a],
# not as the checkpoint's per-key-head groups. Every shape fits; every output is wrong.
import torch

from kernels_reference.L2.qwen3_next_gated_delta_net import Qwen3NextGatedDeltaNet as _Reference


class Qwen3NextGatedDeltaNet(_Reference):
    def unpack(self, qkvz, ba):
        t = qkvz.shape[0]
        q, k, v, z = qkvz.split([self.key_dim, self.key_dim, self.value_dim, self.value_dim], dim=-1)
        b, a = ba.chunk(2, dim=-1)
        mixed_qkv = torch.cat([q, k, v], dim=-1)
        return mixed_qkv, z.reshape(t, self.num_v_heads, self.head_v_dim), b, a
