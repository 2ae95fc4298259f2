"""FusedMoE: the routed experts of a mixture-of-experts layer, with vLLM's ``FusedMoE`` interface.

``FusedMoE(num_experts, top_k, hidden_size, intermediate_size, renormalize=True)``;
``forward(hidden_states[T, H], router_logits[T, E]) -> [T, H]``. Every token goes to its top-k
experts (:class:`TopKSoftmax`); expert e computes ``down_e(silu(gate_e x) * up_e x)`` and the
token's output is the routing-weighted sum over its k experts. Weights have vLLM's stacked layout:
``w13_weight`` [E, 2 * I, H] (gate rows then up rows of each expert) and ``w2_weight`` [E, H, I].

``forward_native`` is the semantic definition: a plain loop over experts in PyTorch. The routing
and the activation are children (``topk``, ``act_fn``) so composed mode reaches them from here.

``forward_triton`` (CUDA tensors; callable directly, e.g. under the Triton interpreter) is the
production algorithm: route through ``topk``, sort the (token, expert) pairs by expert padded to row
tiles (one or two small kernels), a grouped GEMM for gate_up ([T*k, 2I]), ``act_fn``, a grouped GEMM
for down that scales each row by its routing weight (split over K at decode sizes that leave SMs idle),
and the sum over the k slots (:mod:`kernels_reference.ops.moe.kernels`): six launches. Up to ``GEMV_MAX_TOKENS`` tokens
(decode at small batch) the align step and the grouped GEMMs give way to two GEMV kernels, gate_up
per (token, slot) pair and down with the routing weights and the k-sum folded in: four launches
(topk, gate_up, ``act_fn``, down). No step reads the routing back to the host, so the whole layer is
CUDA-graph capturable.

Under ``torch.compile`` the layer is one opaque custom op, ``fk::fused_moe`` (vLLM compiles its
fused_moe the same way): the expert loop reads the routing on the host (``unique``), which no graph
can hold, and the Triton path is a chain of launches Inductor has nothing to fuse with. The op's
implementation runs this eager ``forward`` for the device (Triton on CUDA, the loop elsewhere) with
the reference routing and activation *inside* the op, as vLLM's op holds its own topk and act; so a
composed candidate TopKSoftmax / SiluAndMul replaces them in eager runs, not in a compiled graph.

Under tensor parallelism (:mod:`kernels_reference.parallel_state`, read when built) every rank
holds every expert with its slice of the intermediate features, as vLLM's ``FusedMoE`` shards them:
``w13_weight`` [E, 2 * I / tp, H] (the rank's gate rows, then its up rows) and ``w2_weight``
[E, H, I / tp]. Each rank's output is a partial sum, all-reduced when ``reduce_results`` (the
default; a layer that reduces later passes False). ``shard_checkpoint`` cuts full tensors, stacked
or per expert.
"""
import functools

import torch
from torch import nn

from ..dispatch import compute_dtype, on_meta, op_name, use_fast_path
from ..native import run
from ..parallel_state import (divide, get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size,
                              tensor_model_parallel_all_reduce, tensor_parallel)
from ..records import RecordsInit
from .silu_and_mul import SiluAndMul
from .topk_softmax import TopKSoftmax

try:
    import triton
except ImportError:
    triton = None


class FusedMoE(RecordsInit, nn.Module):
    RECORDED_WHEN_PASSED = ("reduce_results",)

    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int,
                 renormalize: bool = True, reduce_results: bool = True):
        super().__init__()
        if not 0 < top_k <= num_experts:
            raise ValueError(f"top_k={top_k} must be in 1..num_experts={num_experts}")
        self.num_experts, self.top_k, self.renormalize = num_experts, top_k, renormalize
        self.hidden_size, self.intermediate_size = hidden_size, intermediate_size
        self.tp_size, self.tp_rank = get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
        self.reduce_results = reduce_results
        inter = self.intermediate_size_per_partition = divide(intermediate_size, self.tp_size)
        self.w13_weight = nn.Parameter(torch.empty(num_experts, 2 * inter, hidden_size))
        self.w2_weight = nn.Parameter(torch.empty(num_experts, hidden_size, inter))
        self.topk = TopKSoftmax(top_k, renormalize)
        self.act_fn = SiluAndMul()

    def forward(self, hidden_states: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        if on_meta(hidden_states, router_logits):
            return self.forward_meta(hidden_states, router_logits)
        if torch.compiler.is_compiling():
            return self._reduced(fused_moe(hidden_states, router_logits, self.w13_weight, self.w2_weight,
                                           self.top_k, self.renormalize))
        if triton is not None and use_fast_path(hidden_states, router_logits):
            return self.forward_triton(hidden_states, router_logits)
        return self._forward_loop(hidden_states, router_logits, native=False)

    def forward_native(self, hidden_states: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        return self._forward_loop(hidden_states, router_logits, native=True)

    def _reduced(self, out: torch.Tensor) -> torch.Tensor:
        """This rank's partial sum over its intermediate features, summed over the ranks."""
        return tensor_model_parallel_all_reduce(out) if self.reduce_results and self.tp_size > 1 else out

    def shard_checkpoint(self, param: str, tensor: torch.Tensor, shard=None) -> torch.Tensor:
        """This rank's part of a full ``w13_weight`` / ``w2_weight`` (stacked over experts, or one
        expert's gate or up [I, H] / down [H, I] matrix when ``shard`` names it)."""
        if self.tp_size == 1:
            return tensor
        size = self.intermediate_size_per_partition
        start = self.tp_rank * size
        if param == "w2_weight":  # the intermediate features are the last dimension, stacked or not
            return tensor.narrow(-1, start, size)
        if shard is not None:  # one expert's gate or up matrix
            return tensor.narrow(0, start, size)
        gate, up = tensor.split(self.intermediate_size, dim=1)
        return torch.cat((gate.narrow(1, start, size), up.narrow(1, start, size)), dim=1)

    def _forward_loop(self, hidden_states, router_logits, native):
        # The children are called as modules off the native path (as every composite does), so a
        # composed candidate TopKSoftmax / SiluAndMul is the one that runs here on the CPU too.
        weights, ids = run(self.topk, native, router_logits)
        return self._reduced(expert_loop(hidden_states, weights, ids, self.w13_weight, self.w2_weight,
                                         lambda x: run(self.act_fn, native, x)))

    def forward_meta(self, hidden_states: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        """Shape only (workload capture): the children see the calls the fast path makes (routing on
        [T, E], the activation on [T*k, 2I]); no value-dependent op (the expert loop's unique)."""
        run(self.topk, False, router_logits)
        gate_up = hidden_states.new_empty(hidden_states.shape[0] * self.top_k, 2 * self.intermediate_size_per_partition)
        run(self.act_fn, False, gate_up)
        return torch.empty_like(hidden_states)

    def forward_triton(self, hidden_states: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        from ..ops.moe import kernels as mk  # the Triton kernels load with the fast path only

        t, h = hidden_states.shape
        if h != self.hidden_size:
            raise ValueError(f"FusedMoE(hidden_size={self.hidden_size}) got hidden states of width {h}")
        weights, ids = run(self.topk, False, router_logits)  # the child's fast path (or a candidate's)
        n_pairs = t * self.top_k
        if n_pairs == 0:
            return torch.empty_like(hidden_states)
        x = hidden_states
        num_experts, inter = self.num_experts, self.intermediate_size_per_partition
        gemv = mk.use_gemv(t)  # a few tokens: per-pair GEMVs, no sort (mk.GEMV_MAX_TOKENS)
        if gemv:
            gate_up = mk.gemv_gate_up(x, ids, self.w13_weight)
        else:
            align = mk.align_to_blocks(ids, num_experts, mk.choose_block_m(n_pairs, num_experts))
            gate_up = torch.empty(n_pairs, 2 * inter, dtype=x.dtype, device=x.device)
            mk.grouped_gemm(x, self.w13_weight, gate_up, align, rows_per_a=self.top_k,
                            config=mk.gemm_config("gate_up", n_pairs, num_experts, 2 * inter, h, x))
        act = run(self.act_fn, False, gate_up)  # [T*k, I], pair order
        if gemv:  # down GEMVs, routing weights and the k-sum in one kernel, rounded once
            return self._reduced(mk.gemv_down_sum(act, ids, weights, self.w2_weight, x.dtype))
        down_cfg = mk.gemm_config("down", n_pairs, num_experts, h, inter, act)
        if down_cfg is not None and down_cfg.split_k > 1:  # float32 partial sums over K slices
            down = torch.empty(down_cfg.split_k, n_pairs, h, dtype=torch.float32, device=x.device)
        else:  # each pair's weighted output rounded to x's dtype, as production stores it
            down = torch.empty(n_pairs, h, dtype=x.dtype, device=x.device)
        mk.grouped_gemm(act, self.w2_weight, down, align, rows_per_a=1,
                        routing_weights=weights.reshape(-1).to(torch.float32).contiguous(), config=down_cfg)
        # the k weighted expert outputs of a token (and the K slices) summed in float32, rounded once
        return self._reduced(mk.sum_slots(down, t, self.top_k, x.dtype))


def expert_loop(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, w13: torch.Tensor,
                w2: torch.Tensor, act) -> torch.Tensor:
    """Each expert runs once on the tokens routed to it; outputs accumulate in the compute dtype
    (float32 for half inputs) and are rounded once at the end."""
    compute = compute_dtype(x.dtype)
    out = torch.zeros(x.shape, dtype=compute, device=x.device)
    flat_ids = ids.reshape(-1).long()
    token_of = torch.arange(x.shape[0], device=x.device).repeat_interleave(ids.shape[1])
    for e in torch.unique(flat_ids).tolist():
        rows = (flat_ids == e).nonzero().squeeze(1)
        tokens = token_of[rows]
        h = act(x[tokens] @ w13[e].t())  # [n, I] in x's dtype, as the production kernel rounds it
        y = (h @ w2[e].t()).to(compute) * weights.reshape(-1)[rows].to(compute)[:, None]
        out.index_add_(0, tokens, y)
    return out.to(x.dtype)


# ---- torch.compile: the layer's work as one custom op --------------------------------------------

@functools.lru_cache(maxsize=None)
def _op_layer(num_experts: int, top_k: int, hidden_size: int, intermediate_size: int,
              renormalize: bool) -> FusedMoE:
    """A weightless layer of this shape (built on the meta device, once): the op runs its eager
    ``forward`` with the op's weights bound in, so op and eager module share one code path. Built
    at degree 1 (the weights it is given are already this rank's; the calling layer reduces)."""
    with torch.device("meta"), tensor_parallel(1, 0):
        return FusedMoE(num_experts, top_k, hidden_size, intermediate_size, renormalize)


_OP_NAME = op_name("fused_moe", __name__)  # a copy of this file registers its own op


@torch.library.custom_op(_OP_NAME, mutates_args=())
def fused_moe(hidden_states: torch.Tensor, router_logits: torch.Tensor, w13_weight: torch.Tensor,
              w2_weight: torch.Tensor, top_k: int, renormalize: bool) -> torch.Tensor:
    """``FusedMoE.forward`` as an op: route, run the experts, sum each token's k outputs."""
    num_experts, two_inter, hidden = w13_weight.shape
    layer = _op_layer(num_experts, top_k, hidden, two_inter // 2, renormalize)
    return torch.func.functional_call(layer, {"w13_weight": w13_weight, "w2_weight": w2_weight},
                                      (hidden_states, router_logits))


@fused_moe.register_fake
def _fused_moe_fake(hidden_states, router_logits, w13_weight, w2_weight, top_k, renormalize):
    return hidden_states.new_empty(hidden_states.shape)  # contiguous, as both paths return it
