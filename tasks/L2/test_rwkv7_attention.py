"""RWKV7Attention (L2, flash-linear-attention's ``fla.layers.rwkv7``): RWKV-7 World 2.9B's time-mix
layer -- the token shift carried across steps, the six per-channel mixes, r/k/v projections, the
decay / in-context-learning-rate / value-residual / gate LoRAs, kk and the key update, the
ChunkRWKV7 core through the recurrent-state pool, the per-head GroupNorm, the bonus term
(r . (k * r_k)) v, the output gate and o_proj.

A case is one engine step (``layer_steps``): sequences with ``context`` tokens already folded into
their states and ``query`` new tokens, decodes first (vLLM's order). The prefill batch straddles the
64-token chunk and alternates fresh sequences (their slots hold an earlier owner's rows, which must
not leak in) with continuing ones; decode steps continue every sequence; a mixed step holds both.
These run a layer past the first (``layer_idx`` 1), given layer 0's ``v_first`` as an input. A
second kind runs layer 0 (no ``v_lora``; it returns its own v as ``v_first``) on a prefill step of
fresh sequences only. Two pools per step, in-place outputs compared whole (spare slots no sequence
owns must come back unchanged): ``shift_states`` [slots, hidden] in the activation dtype (each
sequence's last hidden row, FLA's token-shift cache) and ``recurrent_states`` [slots, H, K, V]
float32. Every step writes both, so a layer that does not store the shift row fails every case.
The CPU profile keeps the real 64 x 64 heads, two of them: hidden 128, the low-rank dims cut by
the same factor (2560 / 128).
"""
import dataclasses

import torch
from hypothesis import strategies as st

from fk_pytest import Case, standard_tests
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L2.rwkv7_attention import RWKV7Attention

from ..configs import load_config
from ..dense import DenseTask
from ..linear_inputs import draw_layer_step, layer_steps, prefill_batches
from ..rwkv7_inputs import DECAY_BIAS_RANGE, ICLR_BIAS_RANGE, RWKV7_CHUNK, RWKV7_MODELS, rwkv7_dims
from ..state_steps import StateTask
from ..workload import model_dtype

STATE_SCALE = 2.0  # a running state's size (the L1 task's warmed-up states have std ~2.4)
VALUE_BIAS_RANGE = (-1.0, 1.0)  # v_lora bias: sigmoid 0.27 .. 0.73 of the way to v_first
LAYER = 1  # the scored layer of the main kind: past the first, mixing toward v_first


@dataclasses.dataclass(frozen=True)
class LayerDims:
    hidden_size: int
    num_heads: int
    head_dim: int
    head_v_dim: int
    decay_rank: int
    a_rank: int
    v_rank: int
    gate_rank: int

    @property
    def value_dim(self) -> int:
        return self.num_heads * self.head_v_dim


def layer_dims(model: str, profile: str) -> LayerDims:
    """The layer's dimensions; on the CPU profile 2 real heads (hidden 128) and the config's
    low-rank dims scaled by 128 / hidden (at least 4)."""
    cfg, d = load_config(model), rwkv7_dims(model, profile)
    ranks = [d.decay_low_rank_dim, d.a_low_rank_dim, cfg["v_low_rank_dim"], cfg["gate_low_rank_dim"]]
    hidden = d.hidden_size
    if profile == "cpu":
        hidden = d.num_heads * d.head_dim
        ranks = [max(4, round(r * hidden / d.hidden_size)) for r in ranks]
    return LayerDims(hidden, hidden // d.head_dim, d.head_dim, d.head_v_dim, *ranks)


class RWKV7AttentionTask(StateTask):
    name = "rwkv7_attention"
    level = 2
    family = "linear_attention"
    module_path = "L2/rwkv7_attention.py"
    reference = RWKV7Attention
    fuzz_dtypes = ("bf16",)  # the served dtype; the core's float32 path is the L1 task's job
    state_kinds = ("shift", "recurrent")  # the token-shift row, then the recurrent state

    def cases(self, profile):
        out = []
        for model in RWKV7_MODELS:
            dt, tag = model_dtype(model), DTYPE_NAMES[model_dtype(model)]
            for name, context, query in layer_steps(RWKV7_CHUNK, profile):
                out.append(Case(f"{model}-{name}-{tag}", dt, model=model,
                                params=dict(profile=profile, context=context, query=query, layer=LAYER)))
            # layer 0 (v_first produced, no v_lora) on the chunk-edge prefill batch, every sequence fresh
            lengths = dict(prefill_batches(RWKV7_CHUNK, profile))["varlen"]
            out.append(Case(f"{model}-layer0-prefill-fresh-{tag}", dt, model=model,
                            params=dict(profile=profile, context=[0] * len(lengths), query=list(lengths), layer=0)))
        return out

    def dims(self, case) -> LayerDims:
        return layer_dims(case.model or RWKV7_MODELS[0], case["profile"])

    def init_args(self, case):
        d, cfg = self.dims(case), load_config(case.model or RWKV7_MODELS[0])
        return dict(mode=cfg["attn_mode"], hidden_size=d.hidden_size, head_dim=d.head_dim,
                    decay_low_rank_dim=d.decay_rank, gate_low_rank_dim=d.gate_rank, a_low_rank_dim=d.a_rank,
                    v_low_rank_dim=d.v_rank, norm_eps=cfg["norm_eps"], layer_idx=case["layer"],
                    fuse_norm=cfg["fuse_norm"], value_dim=d.value_dim, num_hidden_layers=cfg["num_hidden_layers"])

    def init_weights(self, module, gen):
        DenseTask.init_weights(self, module, gen)  # matrices at a trained network's scale, norm weight ~ 1
        dev = module.k_k.device

        def uniform(low_high, shape):
            low, high = low_high
            return low + (high - low) * torch.rand(shape, generator=gen, device=dev)

        with torch.no_grad():
            for name in ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g"):  # mixes between a token and its previous one
                getattr(module, name).copy_(uniform((0.0, 1.0), module.x_r.shape))
            module.k_k.copy_(uniform((0.5, 1.0), module.k_k.shape))
            module.k_a.copy_(uniform((0.8, 1.2), module.k_a.shape))
            module.r_k.copy_(0.3 * torch.randn(module.r_k.shape, generator=gen, device=dev))  # a visible bonus
            # per key channel, decays from thousands of tokens of memory to a token or two
            module.w_lora.lora[2].bias.copy_(uniform(DECAY_BIAS_RANGE, module.w_lora.lora[2].bias.shape))
            module.a_lora.lora[2].bias.copy_(uniform(ICLR_BIAS_RANGE, module.a_lora.lora[2].bias.shape))
            if hasattr(module, "v_lora"):
                module.v_lora.lora[2].bias.copy_(uniform(VALUE_BIAS_RANGE, module.v_lora.lora[2].bias.shape))

    def state_shapes(self, case):
        d = self.dims(case)
        return (d.hidden_size,), (d.num_heads, d.head_dim, d.head_v_dim), STATE_SCALE

    def output_names(self, case):
        # layer 0 makes v_first; a later layer hands its input back (the same tensor, as FLA's layer
        # does), which is not an output to score: only o is
        return ("o", "v_first") if case["layer"] == 0 else ("o",)

    def call(self, module, inputs, method=None):
        out = super().call(module, inputs, method)
        return out[0] if "v_first" in inputs else out

    def make_inputs(self, case, gen, device):
        d, t = self.dims(case), sum(case["query"])
        inputs = self.layer_step_inputs(case, gen, device, d.hidden_size)
        if case["layer"] != 0:
            inputs["v_first"] = torch.randn((t, d.value_dim), generator=gen, device=device).to(case.dtype)
        return inputs

    def fuzz_strategy(self, dtype, profile):
        @st.composite
        def draw_case(draw):
            context, query, ident = draw_layer_step(draw, profile, [1, 15, 17, 63, 64, 65])
            layer = draw(st.sampled_from([LAYER, LAYER, 0]))
            return Case(f"fuzz-L{layer}-{ident}-{DTYPE_NAMES[dtype]}", dtype, model=RWKV7_MODELS[0],
                        params=dict(profile=profile, context=context, query=query, layer=layer))

        return draw_case()

    def _weights(self, case) -> int:
        d = self.dims(case)
        key, value, hidden = d.num_heads * d.head_dim, d.value_dim, d.hidden_size
        lora = (hidden + key) * (d.decay_rank + d.a_rank) + (hidden + value) * d.gate_rank
        if case["layer"] != 0:
            lora += (hidden + value) * d.v_rank
        return hidden * (2 * key + value) + value * hidden + lora

    def io_bytes(self, case):
        d = self.dims(case)
        half = torch.finfo(case.dtype).bits // 8
        t, n = sum(case["query"]), len(case["query"])
        continuing = sum(c > 0 for c in case["context"])
        state = d.num_heads * d.head_dim * d.head_v_dim * 4
        # x in, o out, v_first in (or out, layer 0); shift rows and states read (continuing) and written
        activ = (2 * d.hidden_size + d.value_dim) * t * half
        return self._weights(case) * half + activ + (n + continuing) * (state + d.hidden_size * half)

    def flops(self, case):
        d = self.dims(case)
        t = sum(case["query"])
        # per token and head over the K x V state: a^T S (2), decay, correction and rank-1 write (5), read-out (2)
        return 2 * t * self._weights(case) + 9 * t * d.num_heads * d.head_dim * d.head_v_dim


TASK = RWKV7AttentionTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
