# Qwen3NextGatedDeltaNet from this tree's L1 modules. The per-key-head checkpoint layout is undone by
# one column gather: an index built once maps the fused projections' columns to [q | k | v | z] and
# [b | a] in head order. Decodes lead the batch (one token each, continuing; how many from the host
# lengths, or ``num_decodes`` on the padded decode path) and go through the conv update and one
# recurrent call; the rest run as one packed prefill with their own offsets. Nothing reads the
# device to split the batch, so the decode steps can be captured in CUDA graphs.
import torch
import torch.nn.functional as F
from torch import nn

from kernels_reference.forward_context import get_forward_context

from ..L1.gated_delta_rule import GatedDeltaRule
from ..L1.linear import MergedColumnParallelLinear, RowParallelLinear
from ..L1.rms_norm_gated import RMSNormGated
from ..L1.short_convolution import ShortConvolution


def _grouped_to_flat(groups, parts):
    """Column order that reads ``groups`` interleaved groups of ``parts`` widths part by part."""
    width = sum(parts)
    order = []
    for p, w in enumerate(parts):
        start = sum(parts[:p])
        order += [g * width + start + c for g in range(groups) for c in range(w)]
    return torch.tensor(order, dtype=torch.long)


class Qwen3NextGatedDeltaNet(nn.Module):
    def __init__(self, hidden_size, num_k_heads, num_v_heads, head_k_dim, head_v_dim, conv_kernel_size=4,
                 rms_norm_eps=1e-6):
        super().__init__()
        r = num_v_heads // num_k_heads
        self.hk, self.hv, self.dk, self.dv = num_k_heads, num_v_heads, head_k_dim, head_v_dim
        key_dim, value_dim = num_k_heads * head_k_dim, num_v_heads * head_v_dim
        self.sizes = [key_dim, key_dim, value_dim]
        self.in_proj_qkvz = MergedColumnParallelLinear(hidden_size, [2 * key_dim + 2 * value_dim])
        self.in_proj_ba = MergedColumnParallelLinear(hidden_size, [2 * num_v_heads])
        self.conv1d = ShortConvolution(2 * key_dim + value_dim, conv_kernel_size, bias=False, activation="silu")
        self.dt_bias = nn.Parameter(torch.ones(num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(num_v_heads))
        self.gdr = GatedDeltaRule()
        self.norm = RMSNormGated(head_v_dim, eps=rms_norm_eps, group_size=None, norm_before_gate=True)
        self.out_proj = RowParallelLinear(value_dim, hidden_size, bias=False)
        self.register_buffer("qkvz_order", _grouped_to_flat(num_k_heads, [head_k_dim, head_k_dim, r * head_v_dim,
                                                                          r * head_v_dim]), persistent=False)
        self.register_buffer("ba_order", _grouped_to_flat(num_k_heads, [r, r]), persistent=False)
        self.state_cache = None

    def forward(self, hidden_states):
        meta = get_forward_context()
        conv_states, ssm_states = self.state_cache
        n_tok, dev = hidden_states.shape[0], hidden_states.device
        flat = self.in_proj_qkvz(hidden_states).index_select(1, self.qkvz_order)
        qkv, z = flat[:, : sum(self.sizes)], flat[:, sum(self.sizes):]
        b, a = self.in_proj_ba(hidden_states).index_select(1, self.ba_order).chunk(2, dim=1)
        beta = b.sigmoid()
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())

        # Decodes lead (one token each, continuing), prefills follow. The split comes from the host
        # lengths, or from ``num_decodes`` on the padded decode path of the CUDA graphs (every row a
        # decode): nothing here reads the device, so a decode step can be captured.
        qlens, slens = list(meta.query_lens_cpu), list(meta.seq_lens_cpu)
        nd = meta.num_decodes
        if nd is None:
            nd = 0
            while nd < len(qlens) and qlens[nd] == 1 and slens[nd] > 1:
                nd += 1
        n_seq = meta.query_start_loc.numel() - 1
        slots = meta.state_slots.long() if meta.state_slots is not None else torch.arange(n_seq, device=dev)
        out = torch.empty(n_tok, self.hv, self.dv, dtype=hidden_states.dtype, device=dev)

        if nd:
            x = self.conv1d(qkv[:nd], conv_states, cache_indices=slots[:nd])
            out[:nd] = self._rule(x, g[:nd], beta[:nd], ssm_states, slots[:nd], None,
                                  torch.arange(nd + 1, device=dev, dtype=torch.int32))
        if nd < n_seq:
            cu = (meta.query_start_loc[nd:] - nd).to(torch.int32)
            carried = meta.has_initial_state[nd:]
            x = self.conv1d(qkv[nd:], conv_states, query_start_loc=cu, cache_indices=slots[nd:],
                            has_initial_state=carried)
            out[nd:] = self._rule(x, g[nd:], beta[nd:], ssm_states, slots[nd:], carried, cu)

        y = self.norm(out, z.reshape(n_tok, self.hv, self.dv))
        return self.out_proj(y.reshape(n_tok, self.hv * self.dv))

    def _rule(self, x, g, beta, ssm_states, slots, carried, cu):
        n = x.shape[0]
        q, k, v = x.split(self.sizes, dim=1)
        state = ssm_states[slots]
        if carried is not None:  # a fresh sequence's slot holds a former owner's state: start from zeros
            state = state.masked_fill(~carried[:, None, None, None], 0.0)
        o, final = self.gdr(q.reshape(1, n, self.hk, self.dk), k.reshape(1, n, self.hk, self.dk),
                            v.reshape(1, n, self.hv, self.dv), g[None], beta[None], initial_state=state,
                            output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
        ssm_states[slots] = final.to(ssm_states.dtype)
        return o[0]
