"""RMSNormGated: the gated RMSNorm of Mamba-2's mixer and Qwen3-Next's gated DeltaNet (vLLM's
``RMSNormGated`` in ``layers/fla/ops/layernorm_guard.py``, mamba-ssm's ``RMSNormGated``, FLA's
``FusedRMSNormGated``).

``RMSNormGated(hidden_size, eps, group_size, norm_before_gate)``; ``forward(x, z) -> out`` with
``x, z [..., hidden_size]``. The last dimension is cut into groups of ``group_size`` channels
(``None``: one group, the whole row), each normalised by its own root mean square, then scaled by
the per-channel ``weight``. The gate ``silu(z)`` multiplies the output (``norm_before_gate``:
Qwen3-Next, ``norm(x) * silu(z)``, one group per 128-wide head row) or the input (Mamba-2,
``norm(x * silu(z))``, groups of ``intermediate_size / n_groups``). Without ``z`` it is a grouped
RMSNorm. As in vLLM, everything is computed in float32 and rounded once to the input dtype.

The fast path is one Triton program per (tile of rows, group): the group sits in registers, so x
and z are read once and the output written once.
"""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..dispatch import compute_dtype, on_meta, use_fast_path
from ..records import RecordsInit
from ..triton_rows import interpreting, warps_for

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

# A program per (row tile, group) is cheap, but a decode step has few rows: tiles shrink until the
# launch has about two programs per SM of an H200 (132 SMs).
TARGET_PROGRAMS = 264
# Warps per program when even the smallest tiles leave fewer programs than TARGET_PROGRAMS (a decode
# step of Mamba-2's one 5120-wide group: 32 programs of one row each): more warps keep more of each
# row's loads in flight, up to FEW_PROGRAM_WARPS and never below 8 elements a thread (a 128-wide
# head row keeps its one warp). On an H100 on 2026-12-06 (``python3 -m benchmarks norm_launch``)
# the Mamba-2 decode steps T1..T256 took 2.7-5.4 us with 32 warps against 4.1-6.7 us with the size
# rule's 8, and mamba-ssm's kernel 3.8-6.4 us. None keeps the size rule. Module-level so that the
# benchmark can sweep it.
FEW_PROGRAM_WARPS = 32


class RMSNormGated(RecordsInit, nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-5, group_size: Optional[int] = None,
                 norm_before_gate: bool = False, activation: str = "swish"):
        super().__init__()
        group = hidden_size if group_size is None else group_size
        if group <= 0 or hidden_size % group:
            raise ValueError(f"group_size {group_size} does not divide hidden_size {hidden_size}")
        if activation not in ("swish", "silu"):
            raise ValueError(f"RMSNormGated gates with SiLU (swish), not {activation!r}")
        self.hidden_size, self.eps, self.group_size = hidden_size, eps, group_size
        self.norm_before_gate, self.activation = norm_before_gate, activation
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.register_parameter("bias", None)

    @property
    def group(self) -> int:
        return self.hidden_size if self.group_size is None else self.group_size

    def forward(self, x: torch.Tensor, z: Optional[torch.Tensor] = None) -> torch.Tensor:
        if on_meta(x, z):
            return torch.empty_like(x)
        if x.shape[-1] != self.hidden_size or (z is not None and z.shape != x.shape):
            raise ValueError(f"RMSNormGated({self.hidden_size}) got x {tuple(x.shape)}"
                             f"{'' if z is None else f' and z {tuple(z.shape)}'}")
        if triton is not None and use_fast_path(x, z):
            return self.forward_triton(x, z)
        return self.forward_native(x, z)

    def forward_native(self, x: torch.Tensor, z: Optional[torch.Tensor] = None) -> torch.Tensor:
        compute = compute_dtype(x.dtype)
        h = x.to(compute)
        gate = F.silu(z.to(compute)) if z is not None else None
        if gate is not None and not self.norm_before_gate:
            h = h * gate
        grouped = h.unflatten(-1, (self.hidden_size // self.group, self.group))
        rstd = torch.rsqrt(grouped.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        y = (grouped * rstd).flatten(-2) * self.weight.to(compute)
        if gate is not None and self.norm_before_gate:
            y = y * gate
        return y.to(x.dtype)

    def forward_triton(self, x: torch.Tensor, z: Optional[torch.Tensor] = None) -> torch.Tensor:
        rows = _as_rows(x)
        gate = _as_rows(z) if z is not None else rows
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        n_rows = rows.shape[0]
        if n_rows == 0:
            return out
        groups = self.hidden_size // self.group
        block = triton.next_power_of_2(self.group)
        if x.is_cuda and not interpreting():
            per_program = max(1, min(32, 4096 // block))
            while per_program > 1 and triton.cdiv(n_rows, per_program) * groups < TARGET_PROGRAMS:
                per_program //= 2
        else:  # the interpreter pays per program: big tiles
            per_program = max(1, min(triton.next_power_of_2(n_rows), 16384 // block))
        warps = warps_for(block * per_program)
        if FEW_PROGRAM_WARPS and x.is_cuda and triton.cdiv(n_rows, per_program) * groups < TARGET_PROGRAMS:
            warps = max(warps, min(FEW_PROGRAM_WARPS, block * per_program // 256))
        _rms_norm_gated_kernel[(triton.cdiv(n_rows, per_program), groups)](
            rows, gate, self.weight, out, n_rows, rows.stride(0), gate.stride(0), self.hidden_size,
            self.eps, GROUP=self.group, BLOCK=block, ROWS=per_program, HAS_Z=z is not None,
            NORM_BEFORE_GATE=self.norm_before_gate, num_warps=warps)
        return out


def _as_rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` as [rows, width] with contiguous channels: a view where the rows allow one (a column
    slice of a projection output stays a view), else a copy."""
    if t.stride(-1) != 1:
        t = t.contiguous()
    try:
        return t.view(-1, t.shape[-1])
    except RuntimeError:
        return t.reshape(-1, t.shape[-1]).contiguous()


if triton is not None:

    @triton.jit
    def _rms_norm_gated_kernel(x_ptr, z_ptr, w_ptr, out_ptr, n_rows, sx_row, sz_row, so_row, eps,
                               GROUP: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr,
                               HAS_Z: tl.constexpr, NORM_BEFORE_GATE: tl.constexpr):
        row = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
        col = tl.arange(0, BLOCK)
        channel = tl.program_id(1) * GROUP + col
        mask = (row < n_rows)[:, None] & (col < GROUP)[None, :]
        h = tl.load(x_ptr + row[:, None] * sx_row + channel[None, :], mask=mask, other=0.0).to(tl.float32)
        if HAS_Z:
            z = tl.load(z_ptr + row[:, None] * sz_row + channel[None, :], mask=mask, other=0.0).to(tl.float32)
            gate = z * tl.sigmoid(z)
            if not NORM_BEFORE_GATE:
                h = h * gate
        # Padded columns load as 0 (and gate them to 0), so they add nothing to the sum of squares.
        rstd = 1.0 / tl.sqrt(tl.sum(h * h, axis=1) / GROUP + eps)
        w = tl.load(w_ptr + channel, mask=col < GROUP, other=0.0).to(tl.float32)
        y = h * rstd[:, None] * w[None, :]
        if HAS_Z:
            if NORM_BEFORE_GATE:
                y = y * gate
        tl.store(out_ptr + row[:, None] * so_row + channel[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)
