"""MambaMixer2 from this tree's L1 modules: one projection cut into [z | xBC | dt], the step split at
the first sequence that is not a one-token continuation (decodes lead, prefills follow; the padded
decode path of the CUDA graphs says how many rows decode in ``num_decodes``), each part
through its conv call and its scan, the two outputs stacked back in token order before the gated
norm and out_proj. Fresh prefills get zero initial states by masked_fill on the gathered slots."""
import torch
from torch import nn

from kernels_reference.forward_context import get_forward_context

from ..L1.linear import ReplicatedLinear, RowParallelLinear
from ..L1.mamba_chunk_scan import MambaChunkScanCombined
from ..L1.rms_norm_gated import RMSNormGated
from ..L1.selective_state_update import SelectiveStateUpdate
from ..L1.short_convolution import ShortConvolution


class MambaMixer2(nn.Module):
    def __init__(self, hidden_size, ssm_state_size, conv_kernel_size, intermediate_size, use_conv_bias, use_bias,
                 n_groups=1, num_heads=128, head_dim=64, rms_norm_eps=1e-5, activation="silu", use_rms_norm=True,
                 chunk_size=256):
        super().__init__()
        self.h, self.p, self.g, self.n = num_heads, head_dim, n_groups, ssm_state_size
        self.inner = intermediate_size
        self.conv_dim = intermediate_size + 2 * n_groups * ssm_state_size
        self.in_proj = ReplicatedLinear(hidden_size, intermediate_size + self.conv_dim + num_heads, bias=use_bias)
        self.conv1d = ShortConvolution(self.conv_dim, conv_kernel_size, bias=use_conv_bias, activation=activation)
        self.A = nn.Parameter(torch.empty(num_heads))
        self.D = nn.Parameter(torch.ones(num_heads))
        self.dt_bias = nn.Parameter(torch.ones(num_heads))
        self.scan = MambaChunkScanCombined(chunk_size)
        self.step = SelectiveStateUpdate()
        self.norm = RMSNormGated(intermediate_size, eps=rms_norm_eps, group_size=intermediate_size // n_groups,
                                 norm_before_gate=False)
        self.out_proj = RowParallelLinear(intermediate_size, hidden_size, bias=use_bias)
        self.state_cache = None

    def _xbc(self, xbc):
        t = xbc.shape[0]
        x, b, c = torch.split(xbc, [self.inner, self.g * self.n, self.g * self.n], dim=1)
        return x.reshape(t, self.h, self.p), b.reshape(t, self.g, self.n), c.reshape(t, self.g, self.n)

    def forward(self, hidden_states):
        meta = get_forward_context()
        conv_pool, ssm_pool = self.state_cache
        qlens, slens = list(meta.query_lens_cpu), list(meta.seq_lens_cpu)
        nd = meta.num_decodes  # set by the padded decode path (CUDA graphs): every row decodes
        if nd is None:
            nd = 0
            while nd < len(qlens) and qlens[nd] == 1 and slens[nd] > 1:
                nd += 1
        slots = meta.state_slots
        proj = self.in_proj(hidden_states)
        z = proj[:, : self.inner]
        xbc = proj[:, self.inner: self.inner + self.conv_dim]
        dt = proj[:, self.inner + self.conv_dim:]
        a = self.A.float()
        outs = []
        if nd:
            conv = self.conv1d(xbc[:nd], conv_pool, cache_indices=slots[:nd])
            x, b, c = self._xbc(conv)
            y = self.step(ssm_pool, x, dt[:nd].unsqueeze(-1).expand(nd, self.h, self.p),
                          a.view(self.h, 1, 1).expand(self.h, self.p, self.n), b, c,
                          self.D.unsqueeze(-1).expand(self.h, self.p), None,
                          self.dt_bias.unsqueeze(-1).expand(self.h, self.p), slots[:nd])
            outs.append(y.reshape(nd, self.inner))
        if nd < len(qlens):
            starts = meta.query_start_loc[nd:] - nd
            fresh = ~meta.has_initial_state[nd:]
            idx = slots[nd:].long()
            conv = self.conv1d(xbc[nd:], conv_pool, starts, slots[nd:], ~fresh)
            x, b, c = self._xbc(conv)
            init = ssm_pool[idx].masked_fill(fresh.view(-1, 1, 1, 1), 0.0)
            y, last = self.scan(x, dt[nd:], a, b, c, starts, self.D, None, self.dt_bias, init, ssm_pool.dtype)
            ssm_pool[idx] = last.to(ssm_pool.dtype)
            outs.append(y.reshape(-1, self.inner))
        y = outs[0] if len(outs) == 1 else torch.cat(outs, 0)
        return self.out_proj(self.norm(y, z))
