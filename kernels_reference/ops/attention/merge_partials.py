"""Merge two partial attention results over disjoint key sets by their log-sum-exps, in Triton.

A query's attention over keys A and B from its attention over each alone: with l_A, l_B the
log-sum-exps (natural log) of the scaled scores and o_A, o_B the normalised outputs,

    o = (o_A * e^(l_A - m) + o_B * e^(l_B - m)) / (e^(l_A - m) + e^(l_B - m)),  m = max(l_A, l_B).

One program per (token, head block): it reads both partials' rows once and writes one, so the merge
costs a copy of the output, not the several passes eager PyTorch makes in float32.
"""
from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the native path still works without Triton
    triton = None

def merge_partials(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor,
                   out: torch.Tensor) -> torch.Tensor:
    """``out`` [L, H, D] = the merge of (out_a, lse_a) and (out_b, lse_b): outputs [L, H, D] and
    float32 log-sum-exps [L, H], any strides; ``out`` may be ``out_a`` itself (each element is read
    before it is written, by the same program)."""
    if triton is None:
        raise RuntimeError("merge_partials needs Triton")
    length, heads, dim = out.shape
    for name, x in (("out_a", out_a), ("out_b", out_b)):
        if x.shape != out.shape:
            raise ValueError(f"{name} is {tuple(x.shape)}, the output {tuple(out.shape)}")
    for name, x in (("lse_a", lse_a), ("lse_b", lse_b)):
        if x.shape != (length, heads) or x.dtype != torch.float32:
            raise ValueError(f"{name} must be float32 [{length}, {heads}], got {x.dtype} {tuple(x.shape)}")
    if length == 0:
        return out
    if any(x.stride(-1) != 1 for x in (out_a, out_b, out)):
        raise ValueError("partials and output need a unit stride over the head dimension")
    dim_pad = triton.next_power_of_2(dim)
    block_h = max(1, min(triton.next_power_of_2(heads), 4096 // dim_pad))
    grid = (length, triton.cdiv(heads, block_h))
    _merge_kernel[grid](
        out_a, lse_a, out_b, lse_b, out, heads, dim,
        out_a.stride(0), out_a.stride(1), lse_a.stride(0), lse_a.stride(1),
        out_b.stride(0), out_b.stride(1), lse_b.stride(0), lse_b.stride(1),
        out.stride(0), out.stride(1),
        BLOCK_H=block_h, DIM_PAD=dim_pad, num_warps=4)
    return out


if triton is not None:

    @triton.jit
    def _merge_kernel(a_ptr, la_ptr, b_ptr, lb_ptr, out_ptr, heads, dim,
                      a_s0, a_s1, la_s0, la_s1, b_s0, b_s1, lb_s0, lb_s1, o_s0, o_s1,
                      BLOCK_H: tl.constexpr, DIM_PAD: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        d = tl.arange(0, DIM_PAD)
        h_mask = h < heads
        mask = h_mask[:, None] & (d < dim)[None, :]
        la = tl.load(la_ptr + row * la_s0 + h * la_s1, mask=h_mask, other=0.0)
        lb = tl.load(lb_ptr + row * lb_s0 + h * lb_s1, mask=h_mask, other=0.0)
        a = tl.load(a_ptr + row * a_s0 + h[:, None] * a_s1 + d[None, :], mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + row * b_s0 + h[:, None] * b_s1 + d[None, :], mask=mask, other=0.0).to(tl.float32)
        top = tl.maximum(la, lb)  # natural-log weights through exp2: x * log2(e)
        wa = tl.exp2((la - top) * 1.4426950408889634)
        wb = tl.exp2((lb - top) * 1.4426950408889634)
        merged = (a * wa[:, None] + b * wb[:, None]) / (wa + wb)[:, None]
        tl.store(out_ptr + row * o_s0 + h[:, None] * o_s1 + d[None, :], merged.to(out_ptr.dtype.element_ty), mask=mask)
