"""GatedLinearAttention (L2, flash-linear-attention's ``fla.layers.gla``): GLA-1.3B's token mixer --
q/k/v projections, the low-rank per-key-channel decay gk = logsigmoid(gk_proj(x)) / 16, the ChunkGLA
core through the recurrent-state pool, the fused RMSNorm with the swish output gate and o_proj.

A case is one engine step: sequences with ``context`` tokens already folded into their states and
``query`` new tokens, decodes first (vLLM's order). The prefill batch straddles the 64-token chunk
and alternates fresh sequences (their slot holds an earlier owner's state, which must not leak in)
with continuing ones (a later chunk of a chunked prefill: the slot's state is read); decode steps
continue every sequence; a mixed step holds both. The pool (``recurrent_states`` [slots, H, K, V]
float32: GLA-1.3B has no short convolution, so there is no conv window) is an in-place output
compared whole (spare slots no sequence owns must come back unchanged). The CPU profile keeps
GLA-1.3B's expand ratios and its 256 x 512 heads, two of them (hidden size 1024).
"""
import dataclasses

import torch
from hypothesis import strategies as st

from fk_pytest import Case, standard_tests
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L2.gla_layer import GatedLinearAttention

from ..configs import load_config
from ..dense import DenseTask
from ..gla_inputs import GATE_BIAS_RANGE, GLA_CHUNK, GLA_MODELS, STATE_SCALE, GLADims, gla_dims
from ..linear_inputs import draw_layer_step, layer_steps
from ..state_steps import StateTask
from ..workload import model_dtype


def layer_dims(model: str, profile: str) -> GLADims:
    """The layer's dimensions; on the CPU profile the hidden size that gives the CPU heads at the
    config's expand ratios (2 heads of 256 x 512: 1024)."""
    d = gla_dims(model, profile)
    if profile == "cpu":
        d = dataclasses.replace(d, hidden_size=int(d.num_heads * d.head_k_dim / load_config(model)["expand_k"]))
    return d


class GatedLinearAttentionLayerTask(StateTask):
    name = "gated_linear_attention_layer"
    level = 2
    family = "linear_attention"
    module_path = "L2/gla_layer.py"
    reference = GatedLinearAttention
    fuzz_dtypes = ("bf16",)  # the served dtype; the core's float32 path is the L1 task's job
    state_kinds = ("recurrent",)  # no short convolution: the recurrent state is the layer's only pool

    def cases(self, profile):
        out = []
        for model in GLA_MODELS:
            dt = model_dtype(model)
            for name, context, query in layer_steps(GLA_CHUNK, profile):
                out.append(Case(f"{model}-{name}-{DTYPE_NAMES[dt]}", dt, model=model,
                                params=dict(profile=profile, context=context, query=query)))
        return out

    def dims(self, case) -> GLADims:
        return layer_dims(case.model or GLA_MODELS[0], case["profile"])

    def init_args(self, case):
        d, cfg = self.dims(case), load_config(case.model or GLA_MODELS[0])
        # GLA's block passes the config's settings; the gate's rank and normaliser are FLA's defaults
        # (the published config does not carry them), passed explicitly here.
        return dict(mode=cfg["attn_mode"], hidden_size=d.hidden_size, expand_k=cfg["expand_k"],
                    expand_v=cfg["expand_v"], num_heads=d.num_heads, use_short_conv=cfg["use_short_conv"],
                    use_output_gate=cfg.get("use_output_gate", True), gate_fn=cfg["hidden_act"],
                    norm_eps=cfg["rms_norm_eps"], gate_logit_normalizer=d.gate_logit_normalizer,
                    gate_low_rank_dim=d.gate_low_rank_dim, clamp_min=cfg["clamp_min"], fuse_norm=cfg["fuse_norm"])

    def init_weights(self, module, gen):
        DenseTask.init_weights(self, module, gen)  # projections at a trained network's scale, norm weight ~ 1
        bias = module.gk_proj[1].bias
        low, high = GATE_BIAS_RANGE
        with torch.no_grad():
            # Per key channel, decays from a few tokens to many chunks of memory, as trained heads
            # have: a lost, stale or misplaced state, or a decay shared across channels, shows.
            bias.copy_(low + (high - low) * torch.rand(bias.shape, generator=gen, device=bias.device))

    def state_shapes(self, case):
        d = self.dims(case)
        return None, (d.num_heads, d.head_k_dim, d.head_v_dim), STATE_SCALE

    def make_inputs(self, case, gen, device):
        return self.layer_step_inputs(case, gen, device, self.dims(case).hidden_size)

    def fuzz_strategy(self, dtype, profile):
        @st.composite
        def draw_case(draw):
            context, query, ident = draw_layer_step(draw, profile, [1, 15, 17, 63, 64, 65])
            return Case(f"fuzz-{ident}-{DTYPE_NAMES[dtype]}", dtype, model=GLA_MODELS[0],
                        params=dict(profile=profile, context=context, query=query))

        return draw_case()

    def io_bytes(self, case):
        d = self.dims(case)
        half = torch.finfo(case.dtype).bits // 8
        t, n = sum(case["query"]), len(case["query"])
        key_dim, value_dim = d.num_heads * d.head_k_dim, d.num_heads * d.head_v_dim
        weights = (d.hidden_size * (2 * key_dim + 3 * value_dim + d.gate_low_rank_dim)
                   + d.gate_low_rank_dim * key_dim) * half
        continuing = sum(c > 0 for c in case["context"])
        state = d.num_heads * d.head_k_dim * d.head_v_dim * 4
        return weights + 2 * t * d.hidden_size * half + (n + continuing) * state

    def flops(self, case):
        d = self.dims(case)
        t = sum(case["query"])
        key_dim, value_dim = d.num_heads * d.head_k_dim, d.num_heads * d.head_v_dim
        gemms = 2 * t * (d.hidden_size * (2 * key_dim + 3 * value_dim + d.gate_low_rank_dim)
                         + d.gate_low_rank_dim * key_dim)
        # per token and head over the K x V state: decay and rank-1 write (3), read-out (2)
        return gemms + 5 * t * d.num_heads * d.head_k_dim * d.head_v_dim


TASK = GatedLinearAttentionLayerTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
