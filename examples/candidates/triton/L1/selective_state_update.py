# An honest Mamba-2 decode step in plain PyTorch: the batch's states are gathered from the pool,
# advanced by one token in float32 (decay exp(dt * A), plus dt * x B^T), read out against C, and
# scattered back into the same slots with index_copy_.
import torch
import torch.nn.functional as F
from torch import nn


class SelectiveStateUpdate(nn.Module):
    def __init__(self, dt_softplus=True):
        super().__init__()
        self.dt_softplus = dt_softplus

    def forward(self, state, x, dt, A, B, C, D=None, z=None, dt_bias=None, state_batch_indices=None):
        batch, heads, _ = x.shape
        slots = (state_batch_indices.long() if state_batch_indices is not None
                 else torch.arange(batch, device=x.device))
        step = dt.float() if dt_bias is None else dt.float() + dt_bias.float()
        if self.dt_softplus:
            step = F.softplus(step)
        per_group = heads // B.shape[1]
        Bh = B.float().repeat_interleave(per_group, dim=1)  # [batch, heads, N]
        Ch = C.float().repeat_interleave(per_group, dim=1)
        xf = x.float()
        old = state.index_select(0, slots).float()
        new = old * torch.exp(step.unsqueeze(-1) * A.float()) + torch.einsum("bhp,bhn->bhpn", step * xf, Bh)
        state.index_copy_(0, slots, new.to(state.dtype))
        y = torch.einsum("bhpn,bhn->bhp", new, Ch)
        if D is not None:
            y = y + xf * D.float()
        if z is not None:
            y = y * F.silu(z.float())
        return y.to(x.dtype)
