"""Inputs of Mamba-2's SSD tasks (the chunked prefill scan and the decode state update), drawn as a
trained mamba2-2.7b layer feeds them.

Value ranges follow mamba-ssm's Mamba2 initialisation, which training keeps in the same ranges:
A = -exp(A_log) with A in [-16, -1]; dt_bias the inverse softplus of a step drawn log-uniformly in
[time_step_min, time_step_max] = [1e-3, 0.1]; D near 1. x, B and C leave the causal conv through a
SiLU. So each head's step softplus(dt + dt_bias) spans 1e-4 to ~0.5 and its memory ranges from a
few tokens to thousands: some heads forget inside a chunk, others carry a state across many chunks
(which is where chunked scans go wrong). The activations (x, dt, B, C) are in the model dtype and
A in float32, as in vLLM's MambaMixer2 (D and dt_bias there are in the model dtype too: its
parameters are built under the model's default dtype, except A, which it makes float32). The SSM
state is float32: vLLM's ``mamba_ssm_cache_dtype`` setting for accurate serving (SGLang's default;
vLLM's "auto" would store it in the model dtype).
"""
from typing import Dict, Optional, Sequence

import torch
import torch.nn.functional as F

from .linear_inputs import Mamba2Dims, cu_seqlens

STATE_DTYPE = torch.float32
STEP_RANGE = (1e-3, 0.1)  # mamba2-2.7b's time_step_min / time_step_max
INITIAL_STATE_SCALE = 0.1  # about the rms of the states these inputs build up over a few hundred tokens


def head_params(dims: Mamba2Dims, gen: torch.Generator, device, dtype) -> Dict[str, torch.Tensor]:
    """Per-head A (float32), D and dt_bias (model dtype), each [H]."""
    h = dims.num_heads
    a = -(1.0 + 15.0 * torch.rand(h, generator=gen, device=device))
    lo, hi = torch.log(torch.tensor(STEP_RANGE, device=device))
    step = torch.exp(lo + (hi - lo) * torch.rand(h, generator=gen, device=device))
    dt_bias = step + torch.log(-torch.expm1(-step))  # softplus(dt_bias) = step
    d = 1.0 + 0.2 * torch.randn(h, generator=gen, device=device)
    return {"A": a, "D": d.to(dtype), "dt_bias": dt_bias.to(dtype)}


def token_inputs(dims: Mamba2Dims, tokens: int, gen: torch.Generator, device, dtype) -> Dict[str, torch.Tensor]:
    """x [T, H, P], dt [T, H], B and C [T, G, N] as the conv and in_proj hand them over.

    x, B and C are views into one [T, conv_dim] buffer, as vLLM splits the conv output (strided rows)."""
    h, p, g, n = dims.num_heads, dims.head_dim, dims.n_groups, dims.state_size
    xbc = F.silu(torch.randn((tokens, dims.conv_dim), generator=gen, device=device) * 1.5).to(dtype)
    x, b, c = torch.split(xbc, [h * p, g * n, g * n], dim=-1)
    dt = torch.randn((tokens, h), generator=gen, device=device).to(dtype)
    return {"x": x.view(tokens, h, p), "dt": dt, "B": b.view(tokens, g, n), "C": c.view(tokens, g, n)}


def initial_states(dims: Mamba2Dims, carried: Sequence[bool], gen: torch.Generator, device) -> torch.Tensor:
    """[S, H, P, N] float32: a state for every sequence that continues (chunked prefill or a prefix),
    zeros for the others, as vLLM's mixer builds them with torch.where(has_initial_states, ...)."""
    shape = (len(carried), dims.num_heads, dims.head_dim, dims.state_size)
    states = torch.randn(shape, generator=gen, device=device) * INITIAL_STATE_SCALE
    states[~torch.tensor(list(carried), dtype=torch.bool, device=device)] = 0
    return states.to(STATE_DTYPE)


def carried_states(lengths: Sequence[int]) -> Sequence[bool]:
    """Which sequences of a batch continue from a state: all but the first of a batch (a new
    request beside continuing ones), the only one of a single-sequence batch."""
    return [True] if len(lengths) == 1 else [i > 0 for i in range(len(lengths))]


def prefill_inputs(dims: Mamba2Dims, lengths: Sequence[int], with_state: bool, gen: torch.Generator, device,
                   dtype) -> Dict[str, Optional[torch.Tensor]]:
    params = head_params(dims, gen, device, dtype)
    out = dict(token_inputs(dims, sum(lengths), gen, device, dtype))
    out.update(A=params["A"], cu_seqlens=cu_seqlens(lengths, device), D=params["D"], dt_bias=params["dt_bias"])
    out["initial_states"] = initial_states(dims, carried_states(lengths), gen, device) if with_state else None
    return out


def decode_inputs(dims: Mamba2Dims, batch: int, pool: int, gen: torch.Generator, device,
                  dtype) -> Dict[str, torch.Tensor]:
    """One token per sequence; the pool holds every slot's state, the batch's in random slots.

    dt, A, D and dt_bias are per-head values broadcast over head_dim (and A over the state), as
    vLLM's mixer expands them for ``selective_state_update``."""
    h, p, n = dims.num_heads, dims.head_dim, dims.state_size
    params = head_params(dims, gen, device, dtype)
    tokens = token_inputs(dims, batch, gen, device, dtype)
    state = (torch.randn((pool, h, p, n), generator=gen, device=device) * INITIAL_STATE_SCALE).to(STATE_DTYPE)
    slots = torch.randperm(pool, generator=gen, device=device)[:batch].to(torch.int32)
    return {"state": state, "x": tokens["x"], "dt": tokens["dt"][:, :, None].expand(-1, -1, p),
            "A": params["A"][:, None, None].expand(-1, p, n), "B": tokens["B"], "C": tokens["C"],
            "D": params["D"][:, None].expand(-1, p), "dt_bias": params["dt_bias"][:, None].expand(-1, p),
            "state_batch_indices": slots}
