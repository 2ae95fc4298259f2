"""Torch stand-ins for the gated RMSNorm functions of flash-linear-attention and mamba-ssm, as their
signatures and docstrings state them, so CPU tests check the peers' plumbing (which argument is the
gate, the group size, the norm's place), not the libraries' kernels (FLA's launcher needs a GPU
driver). ``GATE_SIDE_SWAPPED`` makes both gate on the wrong side of the norm (a bug the task's check
must see)."""
import torch
import torch.nn.functional as F

GATE_SIDE_SWAPPED = False


def _norm(x, weight, z, eps, group_size, norm_before_gate):
    h, gate = x.float(), F.silu(z.float())
    before = norm_before_gate != GATE_SIDE_SWAPPED
    if not before:
        h = h * gate
    group = x.shape[-1] if group_size is None else group_size
    grouped = h.unflatten(-1, (x.shape[-1] // group, group))
    y = (grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + eps)).flatten(-2) * weight.float()
    if before:
        y = y * gate
    return y.to(x.dtype)


def rmsnorm_fn(x, weight, bias, z=None, eps=1e-6, group_size=None, norm_before_gate=True):
    """mamba-ssm's ``ops.triton.layernorm_gated.rmsnorm_fn`` and FLA's copy in ``layernorm_gated``."""
    assert bias is None and z is not None
    return _norm(x, weight, z, eps, group_size, norm_before_gate)


def rms_norm_gated(x, g, weight, bias, activation="swish", residual=None, prenorm=False, residual_in_fp32=False,
                   eps=1e-6):
    """FLA's ``fused_norm_gate.rms_norm_gated``: the whole row normalised, then times swish(g)."""
    assert bias is None and residual is None and activation in ("swish", "silu")
    return _norm(x, weight, g, eps, None, True)
