# WRONG L1 FusedMoE: the honest candidate (moe_honest) with the gate and up halves of w13 swapped,
# silu(up) * gate instead of silu(gate) * up. Composed mode must fail every MoE task from L2 to L4.
import torch
from torch import nn


class FusedMoE(nn.Module):
    def __init__(self, num_experts, top_k, hidden_size, intermediate_size, renormalize=True):
        super().__init__()
        self.top_k, self.renormalize, self.intermediate_size = top_k, renormalize, intermediate_size
        self.w13_weight = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.w2_weight = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))

    def forward(self, hidden_states, router_logits):
        probs = torch.softmax(router_logits.float(), dim=-1)
        weights, ids = probs.topk(self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(-1, keepdim=True)
        t, k = ids.shape
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        partial = torch.empty(t * k, hidden_states.shape[1], dtype=torch.float32, device=hidden_states.device)
        sorted_ids = flat[order]
        for e in torch.unique(sorted_ids).tolist():
            pairs = order[sorted_ids == e]
            x = hidden_states[pairs // k]
            gate_up = x @ self.w13_weight[e].t()
            up, gate = gate_up[:, :self.intermediate_size].float(), gate_up[:, self.intermediate_size:].float()
            h = (torch.nn.functional.silu(gate) * up).to(hidden_states.dtype)
            partial[pairs] = (h @ self.w2_weight[e].t()).float() * weights.reshape(-1)[pairs, None]
        return partial.view(t, k, -1).sum(1).to(hidden_states.dtype)
