# Wrong: adds the shared expert without its sigmoid gate (as DeepSeek's shared experts are added).
# The routed part is the reference's; only the shared expert's scale is off.
from torch import nn

from kernels_reference.L1.fused_moe import FusedMoE
from kernels_reference.L1.linear import ReplicatedLinear
from kernels_reference.L2.llama_mlp import LlamaMLP


class Qwen3NextSparseMoeBlock(nn.Module):
    def __init__(self, hidden_size, moe_intermediate_size, num_experts, num_experts_per_tok, norm_topk_prob=True,
                 shared_expert_intermediate_size=0):
        super().__init__()
        self.gate = ReplicatedLinear(hidden_size, num_experts, bias=False)
        self.experts = FusedMoE(num_experts, num_experts_per_tok, hidden_size, moe_intermediate_size,
                                renormalize=norm_topk_prob)
        self.shared_expert = LlamaMLP(hidden_size, shared_expert_intermediate_size)
        self.shared_expert_gate = ReplicatedLinear(hidden_size, 1, bias=False)

    def forward(self, hidden_states):
        out = self.experts(hidden_states, self.gate(hidden_states)).float()
        return (out + self.shared_expert(hidden_states).float()).to(hidden_states.dtype)
