"""The decode step of Mamba-2 (``selective_state_update``): one token per sequence advances that
sequence's state in the slot pool, in place, and reads y off the new state.

One program per (block of head_dim rows, batch row, head): it loads the [rows, N] slice of the
state once, updates it in float32 registers, stores it back in the pool's dtype and reduces it
against C for the output. The step is pure state bandwidth (read and write H*P*N values per
sequence), so the tile is a few rows of the full state width, enough programs to cover the GPU at
batch 1, and every other operand is a handful of bytes. dt, A, dt_bias and D come broadcast over
head_dim (stride 0, as vLLM passes per-head values); strides are honoured, so they may also vary.
"""
from typing import Optional

import torch

from ...triton_rows import interpreting

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None


def selective_state_update(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                           B: torch.Tensor, C: torch.Tensor, D: Optional[torch.Tensor] = None,
                           z: Optional[torch.Tensor] = None, dt_bias: Optional[torch.Tensor] = None,
                           dt_softplus: bool = False,
                           state_batch_indices: Optional[torch.Tensor] = None) -> torch.Tensor:
    batch, heads, head_dim = x.shape
    groups, dstate = B.shape[1], B.shape[2]
    if heads % groups:
        raise ValueError(f"{heads} heads do not split into {groups} groups")
    out = torch.empty((batch, heads, head_dim), dtype=x.dtype, device=x.device)
    if batch == 0:
        return out
    block_n = max(16, triton.next_power_of_2(dstate))
    if interpreting() or not x.is_cuda:
        block_p = max(1, triton.next_power_of_2(head_dim))  # one program per (row, head)
    else:  # ~512 state values per program: batch 1 still spreads over every SM
        block_p = max(1, min(triton.next_power_of_2(head_dim), 512 // block_n if block_n <= 512 else 1))
    has_bias, has_d, has_z = dt_bias is not None, D is not None, z is not None
    has_idx = state_batch_indices is not None
    bias = dt_bias if has_bias else dt[0]
    d = D if has_d else dt[0]
    zz = z if has_z else x
    # Per-head dt, dt_bias and A broadcast over head_dim (and A over the state width), as vLLM passes
    # them: one softplus and one exp per program instead of one per state value, the same arithmetic.
    per_head = dt.stride(2) == 0 and A.stride(1) == 0 and A.stride(2) == 0 and (not has_bias or bias.stride(1) == 0)
    grid = (triton.cdiv(head_dim, block_p), batch, heads)
    _state_update_kernel[grid](
        state, x, dt, bias, A, B, C, d, zz, out, state_batch_indices if has_idx else out,
        head_dim, dstate, heads // groups,
        *state.stride(), *x.stride(), *dt.stride(), *bias.stride(), *A.stride(), *B.stride(), *C.stride(),
        *d.stride(), *zz.stride(), *out.stride(),
        SOFTPLUS=dt_softplus, HAS_BIAS=has_bias, HAS_D=has_d, HAS_Z=has_z, HAS_INDEX=has_idx, PER_HEAD=per_head,
        BLOCK_P=block_p, BLOCK_N=block_n, num_warps=4 if block_p * block_n >= 512 else 2)
    return out


if triton is not None:

    @triton.jit
    def _state_update_kernel(state_ptr, x_ptr, dt_ptr, bias_ptr, a_ptr, b_ptr, c_ptr, d_ptr, z_ptr, out_ptr,
                             index_ptr, head_dim, dstate, ratio,
                             ss_s, ss_h, ss_p, ss_n, sx_b, sx_h, sx_p, sdt_b, sdt_h, sdt_p, sbias_h, sbias_p,
                             sa_h, sa_p, sa_n, sb_b, sb_g, sb_n, sc_b, sc_g, sc_n, sd_h, sd_p,
                             sz_b, sz_h, sz_p, so_b, so_h, so_p,
                             SOFTPLUS: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_D: tl.constexpr,
                             HAS_Z: tl.constexpr, HAS_INDEX: tl.constexpr, PER_HEAD: tl.constexpr,
                             BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
        row = tl.program_id(1)
        head = tl.program_id(2)
        ps = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
        ns = tl.arange(0, BLOCK_N)
        p_ok, n_ok = ps < head_dim, ns < dstate
        tile_ok = p_ok[:, None] & n_ok[None, :]
        slot = tl.load(index_ptr + row).to(tl.int64) if HAS_INDEX else row.to(tl.int64)
        s_ptrs = state_ptr + slot * ss_s + head * ss_h + ps[:, None] * ss_p + ns[None, :] * ss_n
        s = tl.load(s_ptrs, mask=tile_ok, other=0.0).to(tl.float32)
        x = tl.load(x_ptr + row * sx_b + head * sx_h + ps * sx_p, mask=p_ok, other=0.0).to(tl.float32)
        group = head // ratio
        b = tl.load(b_ptr + row * sb_b + group * sb_g + ns * sb_n, mask=n_ok, other=0.0).to(tl.float32)
        c = tl.load(c_ptr + row * sc_b + group * sc_g + ns * sc_n, mask=n_ok, other=0.0).to(tl.float32)
        if PER_HEAD:  # dt, dt_bias and A are one value per head
            dt = tl.load(dt_ptr + row * sdt_b + head * sdt_h).to(tl.float32)
            if HAS_BIAS:
                dt += tl.load(bias_ptr + head * sbias_h).to(tl.float32)
        else:
            dt = tl.load(dt_ptr + row * sdt_b + head * sdt_h + ps * sdt_p, mask=p_ok, other=0.0).to(tl.float32)
            if HAS_BIAS:
                dt += tl.load(bias_ptr + head * sbias_h + ps * sbias_p, mask=p_ok, other=0.0).to(tl.float32)
        if SOFTPLUS:
            dt = tl.where(dt <= 20.0, tl.log(1.0 + tl.exp(dt)), dt)
        if PER_HEAD:
            decay = tl.exp(tl.load(a_ptr + head * sa_h).to(tl.float32) * dt)
        else:
            a = tl.load(a_ptr + head * sa_h + ps[:, None] * sa_p + ns[None, :] * sa_n, mask=tile_ok,
                        other=0.0).to(tl.float32)
            decay = tl.exp(a * dt[:, None])
        s = decay * s + (dt * x)[:, None] * b[None, :]
        tl.store(s_ptrs, s.to(state_ptr.dtype.element_ty), mask=tile_ok)
        y = tl.sum(s * c[None, :], axis=1)
        if HAS_D:
            y += x * tl.load(d_ptr + head * sd_h + ps * sd_p, mask=p_ok, other=0.0).to(tl.float32)
        if HAS_Z:
            zv = tl.load(z_ptr + row * sz_b + head * sz_h + ps * sz_p, mask=p_ok, other=0.0).to(tl.float32)
            y *= zv * tl.sigmoid(zv)
        tl.store(out_ptr + row * so_b + head * so_h + ps * so_p, y.to(out_ptr.dtype.element_ty), mask=p_ok)
