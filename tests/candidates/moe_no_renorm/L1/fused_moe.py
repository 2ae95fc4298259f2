# WRONG: never renormalises the k routing weights (right only where the model does not: DeepSeek-V2).
import torch
import torch.nn.functional as F
from torch import nn


class FusedMoE(nn.Module):
    def __init__(self, num_experts, top_k, hidden_size, intermediate_size, renormalize=True):
        super().__init__()
        self.top_k, self.renormalize = top_k, renormalize
        self.w13_weight = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.w2_weight = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))

    def forward(self, hidden_states, router_logits):
        probs = torch.softmax(router_logits.float(), dim=-1)
        w, ids = torch.topk(probs, self.top_k, dim=-1)
        x = hidden_states.float()
        w13, w2 = self.w13_weight[ids].float(), self.w2_weight[ids].float()  # [T, k, 2I, H], [T, k, H, I]
        gate, up = torch.einsum("th,tknh->tkn", x, w13).chunk(2, dim=-1)
        act = (F.silu(gate) * up)
        y = torch.einsum("tki,tkhi->tkh", act, w2)
        return (y * w[..., None]).sum(1).to(hidden_states.dtype)
