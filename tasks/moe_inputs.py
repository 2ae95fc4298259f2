"""Shared pieces of the mixture-of-experts tasks (``fused_moe``, ``topk_softmax``): the models, their
expert shapes, token counts and the router logits they are fed.

Models: Mixtral-8x7B (E=8, k=2, renormalised), Qwen3-30B-A3B (E=128, k=8, ``norm_topk_prob``) and
DeepSeek-V2-Lite (E=64, k=6, no renormalisation; its 2 shared experts are a dense MLP at L2), bf16.

Token counts: the full profile takes the token counts of each model's captured FusedMoE calls
(``tasks/workloads/<model>.json``) with their call shares as weights, up to 8192 tokens. The CPU profile keeps the real E and k but cuts the widths (``CPU_WIDTHS``) and runs 1, 5 and
17 tokens: the float64 truth and Triton's interpreter stay fast, and every expert count, top-k and
renormalisation the real layers have is still exercised.

Router logits. Real routing statistics need the trained router, which we do not have. The stand-in:
a fixed popularity bias per expert, Zipf-like (expert of popularity rank r gets logit bias
``-ROUTING_SKEW * log(1 + r)``, i.e. a prior probability proportional to (1 + r) ** -ROUTING_SKEW),
plus unit Gaussian noise per token and expert. Trained routers are load-balanced but far from
uniform, so some experts get several times the mean rows and some none: the speed cases are not a
uniformly routed best case, and the zero-token expert occurs. The logits are then made **tie-free
with a margin** (``separate_top_k``): the k+1 largest logits of every token are pushed apart to a few
units of the dtype's rounding, so any honest router picks the same experts in the same order, and
the ids can be compared exactly.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Dict, List, Tuple

import torch

from .configs import load_config
from .workload import token_cases

MOE_MODELS = ("mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v2-lite")
MAX_FULL_TOKENS = 8192
CPU_TOKENS = {"decode": (1, 5), "prefill": (17,)}
# (hidden, intermediate) cut for the CPU profile, multiples of 16 (the GEMM tiles' minimum) except
# DeepSeek's intermediate, which leaves a partial K tile in the down GEMM.
CPU_WIDTHS = {"mixtral-8x7b": (128, 64), "qwen3-30b-a3b": (64, 32), "deepseek-v2-lite": (96, 40)}
ROUTING_SKEW = 0.6


@dataclasses.dataclass(frozen=True)
class MoeShape:
    num_experts: int
    top_k: int
    hidden_size: int
    intermediate_size: int
    renormalize: bool

    def init_args(self) -> Dict:
        return dataclasses.asdict(self)


def moe_shape(model: str, profile: str = "full") -> MoeShape:
    cfg = load_config(model)
    experts = cfg.get("num_local_experts") or cfg.get("num_experts") or cfg["n_routed_experts"]
    hidden, inter = cfg["hidden_size"], cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
    if profile == "cpu":
        hidden, inter = CPU_WIDTHS[model]
    # Mixtral's config has no norm_topk_prob: it always renormalises (softmax over the top-k logits).
    return MoeShape(experts, cfg["num_experts_per_tok"], hidden, inter, bool(cfg.get("norm_topk_prob", True)))


def moe_token_cases(model: str, profile: str) -> List[Tuple[str, int, float, str]]:
    """(phase, tokens, weight, source) of one model."""
    if profile == "cpu":
        return [(phase, t, 1.0, "hand-picked") for phase, counts in CPU_TOKENS.items() for t in counts]
    cls = "FusedMoE"
    return token_cases(model, profile, cls, max_tokens=MAX_FULL_TOKENS)[""]


@functools.lru_cache(maxsize=None)
def _popularity_bias(num_experts: int) -> torch.Tensor:
    """The fixed per-expert bias: a seeded permutation of Zipf ranks (the same in every draw, as a
    trained router's preferences are)."""
    rank = torch.randperm(num_experts, generator=torch.Generator().manual_seed(1000 + num_experts))
    return -ROUTING_SKEW * torch.log1p(rank.to(torch.float32))


def tie_margin(dtype: torch.dtype, scale: float) -> float:
    """A clear gap between neighbouring top logits: 4 units of the dtype's rounding at the logits'
    magnitude (and at least 32 float32 units, the float32 softmax's own rounding)."""
    eps = max(4 * torch.finfo(dtype).eps, 32 * torch.finfo(torch.float32).eps)
    return eps * max(1.0, scale)


def separate_top_k(logits: torch.Tensor, top_k: int, dtype: torch.dtype) -> torch.Tensor:
    """Shift, per token, every logit below the j-th largest down until the j-th and (j+1)-th largest
    are ``tie_margin`` apart, for j = 1..k (so the top k are ordered and the k-th is clear of the
    rest). The order of the logits never changes; most rows need no shift."""
    vals, order = torch.sort(logits.to(torch.float32), dim=-1, descending=True)
    # headroom: shifting lowers values, so the magnitude (and the rounding unit) can grow a little
    margin = tie_margin(dtype, 1.5 * float(vals.abs().amax()) + 1.0) if vals.numel() else 0.0
    for j in range(1, min(top_k, vals.shape[-1] - 1) + 1):
        deficit = (margin - (vals[:, j - 1] - vals[:, j])).clamp(min=0)
        vals[:, j:] -= deficit[:, None]
    return torch.empty_like(vals).scatter_(-1, order, vals)


def router_logits(tokens: int, num_experts: int, top_k: int, gen: torch.Generator, device,
                  dtype: torch.dtype) -> torch.Tensor:
    """[tokens, num_experts] router logits: skewed popularity plus per-token noise, tie-free."""
    noise = torch.randn((tokens, num_experts), generator=gen, device=device, dtype=torch.float32)
    logits = separate_top_k(noise + _popularity_bias(num_experts).to(device), top_k, dtype).to(dtype)
    return logits


def check_tie_free(logits: torch.Tensor, top_k: int) -> float:
    """The smallest gap between neighbours among each token's k+1 largest logits (as stored)."""
    vals = torch.sort(logits.to(torch.float64), dim=-1, descending=True).values
    n = min(top_k + 1, vals.shape[-1])
    return float((vals[:, : n - 1] - vals[:, 1:n]).min()) if n > 1 else float("inf")


@functools.lru_cache(maxsize=None)
def activated_experts(tokens: int, num_experts: int, top_k: int) -> int:
    """Experts one draw of the routing activates (their weights are what a decode step streams)."""
    gen = torch.Generator().manual_seed(tokens * 7919 + num_experts)
    logits = router_logits(tokens, num_experts, top_k, gen, "cpu", torch.float32)
    return int(torch.topk(logits, top_k, dim=-1).indices.unique().numel())
