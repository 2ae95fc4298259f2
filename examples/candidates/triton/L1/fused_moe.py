# An honest MoE layer in plain PyTorch: token/expert pairs sorted by expert, then one grouped GEMM
# per projection over every expert's rows (torch._grouped_mm; its group ends stay on the device, so
# a CUDA graph can hold it), the routing-weighted results added back per token in float32.
# Where that GEMM would read the ends back to the host (GPUs other than sm90/sm100, dtypes other
# than bf16) or is missing: one GEMM pair per expert on its rows, and inside a CUDA-graph capture
# (the engine decodes in graphs), where the row counts cannot be read back, every expert on every
# token with the routing weights (zero off-route) masking the results.
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
        if self._grouped_gemm_fits(hidden_states):
            return self._grouped_experts(hidden_states, weights, ids)
        if hidden_states.is_cuda and torch.cuda.is_current_stream_capturing():
            routing = torch.zeros(t, self.num_experts, dtype=torch.float32, device=hidden_states.device)
            routing.scatter_add_(1, ids, weights.float())
            out = sum(self._expert(e, hidden_states) * routing[:, e:e + 1] for e in range(self.num_experts))
            return out.to(hidden_states.dtype)
        expert_of_pair, order, token_of_pair = self._sorted_pairs(ids)
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

    def _grouped_gemm_fits(self, x):
        if not hasattr(torch, "_grouped_mm") or x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            return False
        # its operands' row strides must be multiples of 16 bytes
        if any(n * x.element_size() % 16 for n in (x.shape[1], self.w2_weight.shape[2])):
            return False
        if x.is_cuda:  # elsewhere it loops over the groups with their ends read back to the host
            return x.dtype == torch.bfloat16 and torch.cuda.get_device_capability(x.device)[0] in (9, 10)
        return x.device.type == "cpu"

    def _sorted_pairs(self, ids):
        """Each (token, expert) pair's expert, the pairs' order sorted by expert, and their tokens."""
        expert_of_pair = ids.reshape(-1)
        order = torch.argsort(expert_of_pair, stable=True)
        return expert_of_pair, order, order // self.top_k

    def _grouped_experts(self, hidden_states, weights, ids):
        t, h = hidden_states.shape
        expert_of_pair, order, token_of_pair = self._sorted_pairs(ids)
        # each expert's last row + 1 in the sorted pairs, found on the device (bincount reads its
        # largest value back to the host on a GPU)
        experts = torch.arange(self.num_experts, device=ids.device, dtype=expert_of_pair.dtype)
        ends = torch.searchsorted(expert_of_pair[order], experts, right=True).to(torch.int32)
        x = hidden_states[token_of_pair]
        gate, up = torch._grouped_mm(x, self.w13_weight.transpose(1, 2), offs=ends).float().chunk(2, dim=-1)
        act = (F.silu(gate) * up).to(x.dtype)
        y = torch._grouped_mm(act, self.w2_weight.transpose(1, 2), offs=ends).float()
        out = torch.zeros(t, h, dtype=torch.float32, device=hidden_states.device)
        out.index_add_(0, token_of_pair, y * weights.reshape(-1)[order, None].float())
        return out.to(hidden_states.dtype)
