# An honest MoE layer in plain PyTorch: pairs sorted by expert, one GEMM pair per expert on its rows,
# the routing-weighted results added back per token in float32. Inside a CUDA-graph capture (the
# engine decodes in graphs) the per-expert row counts cannot be read back, so there every expert runs
# on every token and the routing weights (zero off-route) mask the results.
# Under tensor parallelism each rank holds every expert's slice of the intermediate features and
# the partial outputs are summed over the ranks.
import torch
import torch.nn.functional as F
from torch import nn

from kernels_reference.parallel_state import get_tensor_model_parallel_world_size, tensor_model_parallel_all_reduce


class _Gate(nn.Module):
    def __init__(self, top_k, renormalize):
        super().__init__()
        self.top_k, self.renormalize = top_k, renormalize

    def forward(self, logits):
        probs = torch.softmax(logits.float(), dim=-1)
        w, ids = torch.topk(probs, self.top_k, dim=-1)
        return (w / w.sum(-1, keepdim=True) if self.renormalize else w), ids


class FusedMoE(nn.Module):
    def __init__(self, num_experts, top_k, hidden_size, intermediate_size, renormalize=True, reduce_results=True):
        super().__init__()
        self.num_experts, self.top_k = num_experts, top_k
        self.tp = get_tensor_model_parallel_world_size()
        self.reduce_results = reduce_results
        inter = intermediate_size // self.tp
        self.w13_weight = nn.Parameter(torch.empty(num_experts, 2 * inter, hidden_size))
        self.w2_weight = nn.Parameter(torch.empty(num_experts, hidden_size, inter))
        self.gate = _Gate(top_k, renormalize)

    def forward(self, hidden_states, router_logits):
        out = self._experts(hidden_states, router_logits)
        return tensor_model_parallel_all_reduce(out) if self.tp > 1 and self.reduce_results else out

    def _expert(self, e, x):
        gate, up = (x @ self.w13_weight[e].t()).float().chunk(2, dim=-1)
        return ((F.silu(gate) * up).to(x.dtype) @ self.w2_weight[e].t()).float()

    def _experts(self, hidden_states, router_logits):
        t, h = hidden_states.shape
        weights, ids = self.gate(router_logits)
        if hidden_states.is_cuda and torch.cuda.is_current_stream_capturing():
            routing = torch.zeros(t, self.num_experts, dtype=torch.float32, device=hidden_states.device)
            routing.scatter_add_(1, ids, weights.float())
            out = sum(self._expert(e, hidden_states) * routing[:, e:e + 1] for e in range(self.num_experts))
            return out.to(hidden_states.dtype)
        expert_of_pair = ids.reshape(-1)
        order = torch.argsort(expert_of_pair, stable=True)
        token_of_pair = order // self.top_k
        counts = torch.bincount(expert_of_pair, minlength=self.num_experts).tolist()
        out = torch.zeros(t, h, dtype=torch.float32, device=hidden_states.device)
        start = 0
        for e, n in enumerate(counts):
            if n:
                pairs, tokens = order[start:start + n], token_of_pair[start:start + n]
                y = self._expert(e, hidden_states[tokens]) * weights.reshape(-1)[pairs, None]
                out.index_add_(0, tokens, y)
            start += n
        return out.to(hidden_states.dtype)
