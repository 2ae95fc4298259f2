# WRONG: assembles the step's output with the prefill tokens first and the decode tokens after
# (the order of older engines), while vLLM puts decodes first. Each phase alone is right, and the
# state pools are right everywhere: only the rows of a mixed step are misplaced.
import torch

from kernels_reference.forward_context import get_forward_context, state_phases
from kernels_reference.L2 import qwen3_next_gated_delta_net as reference


class Qwen3NextGatedDeltaNet(reference.Qwen3NextGatedDeltaNet):
    def forward(self, hidden_states):
        conv_states, ssm_states = self.state_cache
        t = hidden_states.shape[0]
        mixed_qkv, z = self.unpack(self.in_proj_qkvz(hidden_states))
        g, beta = self.gates(self.in_proj_ba(hidden_states), False)
        parts = []
        for phase in state_phases(get_forward_context(), t):
            tokens, qsl, slots, continues, decode = (phase.tokens, phase.query_start_loc, phase.slots,
                                                     phase.continues, phase.decode)
            x = mixed_qkv[tokens]
            if decode:
                x = self.conv1d(x, conv_states, cache_indices=slots)
            else:
                x = self.conv1d(x, conv_states, query_start_loc=qsl, cache_indices=slots, has_initial_state=continues)
            parts.append(self._delta_rule(x, g[tokens], beta[tokens], ssm_states, qsl, slots, continues, False))
        o = torch.cat(parts[::-1])
        normed = self.norm(o.reshape(-1, self.head_v_dim), z.reshape(-1, self.head_v_dim))
        return self.out_proj(normed.reshape(t, self.value_dim))
