# GatedLinearAttention in plain PyTorch over this tree's ChunkGLA. The five input projections (q, k,
# v, the output gate and the gate's low-rank half) run as one GEMM on the concatenated weights; the
# decay stays in float32 from the logits on. Decode sequences (one token, continuing) are found by a
# mask wherever they sit in the batch and go through one recurrent call; the other sequences are
# gathered into one packed prefill with their own offsets, fresh ones from zero states; outputs are
# scattered back to their tokens and states written to their slots. The gated norm is written out:
# per head row, rms-normalise in float32, scale by the weight, multiply by silu(gate), round once.
import torch
import torch.nn.functional as F
from torch import nn

from kernels_reference.forward_context import get_forward_context

from ..L1.gla import ChunkGLA


class _NormSwishGate(nn.Module):
    def __init__(self, width, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x, gate):
        h = x.float()
        h = h * torch.rsqrt(h.square().mean(-1, keepdim=True) + self.eps) * self.weight.float()
        return (h * F.silu(gate.float())).to(x.dtype)


class GatedLinearAttention(nn.Module):
    def __init__(self, mode="chunk", hidden_size=1024, expand_k=0.5, expand_v=1.0, num_heads=4, num_kv_heads=None,
                 feature_map=None, use_short_conv=False, conv_size=4, conv_bias=False, use_output_gate=True,
                 gate_fn="swish", elementwise_affine=True, norm_eps=1e-5, gate_logit_normalizer=16,
                 gate_low_rank_dim=16, clamp_min=None, fuse_norm=True, layer_idx=None):
        super().__init__()
        assert not use_short_conv and feature_map is None and use_output_gate and fuse_norm
        self.h = num_heads
        self.kd, self.vd = int(hidden_size * expand_k), int(hidden_size * expand_v)
        self.dk, self.dv = self.kd // num_heads, self.vd // num_heads
        self.rank, self.normalizer, self.clamp_min = gate_low_rank_dim, gate_logit_normalizer, clamp_min
        self.q_proj = nn.Linear(hidden_size, self.kd, bias=False)
        self.k_proj = nn.Linear(hidden_size, self.kd, bias=False)
        self.v_proj = nn.Linear(hidden_size, self.vd, bias=False)
        self.g_proj = nn.Linear(hidden_size, self.vd, bias=False)
        self.gk_proj = nn.Sequential(nn.Linear(hidden_size, gate_low_rank_dim, bias=False),
                                     nn.Linear(gate_low_rank_dim, self.kd, bias=True))
        self.g_norm_swish_gate = _NormSwishGate(self.dv, norm_eps)
        self.o_proj = nn.Linear(self.vd, hidden_size, bias=False)
        self.core = ChunkGLA()
        self.state_cache = None

    def forward(self, hidden_states):
        meta = get_forward_context()
        (states,) = self.state_cache
        n_tok, dev = hidden_states.shape[0], hidden_states.device
        weight = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight, self.g_proj.weight,
                            self.gk_proj[0].weight])
        q, k, v, gate, low = (hidden_states @ weight.t()).split([self.kd, self.kd, self.vd, self.vd, self.rank], 1)
        gk = F.logsigmoid(F.linear(low, self.gk_proj[1].weight, self.gk_proj[1].bias).float()) / self.normalizer
        if self.clamp_min is not None:
            gk = gk.clamp_min(self.clamp_min)
        q, k, gk = (x.reshape(n_tok, self.h, self.dk) for x in (q, k, gk))
        v = v.reshape(n_tok, self.h, self.dv)

        starts = meta.query_start_loc.long()
        lens = starts[1:] - starts[:-1]
        carried = meta.seq_lens.long() > lens
        slots = meta.state_slots.long() if meta.state_slots is not None else torch.arange(lens.numel(), device=dev)
        is_decode = (lens == 1) & carried
        out = torch.empty(n_tok, self.h, self.dv, dtype=hidden_states.dtype, device=dev)

        dec = is_decode.nonzero().flatten()
        if dec.numel():
            rows = starts[dec]
            out[rows] = self._run(q[rows], k[rows], v[rows], gk[rows], states, slots[dec], None,
                                  torch.arange(dec.numel() + 1, device=dev))
        pre = (~is_decode).nonzero().flatten()
        if pre.numel():
            seq_of_token = torch.repeat_interleave(torch.arange(lens.numel(), device=dev), lens)
            rows = (~is_decode)[seq_of_token].nonzero().flatten()
            cu = F.pad(lens[pre].cumsum(0), (1, 0))
            out[rows] = self._run(q[rows], k[rows], v[rows], gk[rows], states, slots[pre], carried[pre], cu)

        y = self.g_norm_swish_gate(out, gate.reshape(n_tok, self.h, self.dv))
        return self.o_proj(y.reshape(n_tok, self.vd))

    def _run(self, q, k, v, gk, states, slots, carried, cu):
        start = states[slots]
        if carried is not None:  # a fresh sequence's slot holds a former owner's state: start from zeros
            start = start.masked_fill(~carried[:, None, None, None], 0.0)
        o, final = self.core(q[None], k[None], v[None], gk[None], initial_state=start, output_final_state=True,
                             cu_seqlens=cu)
        states[slots] = final.to(states.dtype)
        return o[0]
