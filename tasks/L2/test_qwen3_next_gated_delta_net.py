"""Qwen3NextGatedDeltaNet (L2, vLLM): Qwen3-Next's linear-attention block -- per-key-head qkvz/ba
projections, short convolution over [q | k | v], the gated delta rule through the recurrent-state
pools, the gated norm and out_proj.

A case is one engine step: sequences with ``context`` tokens already folded into their states and
``query`` new tokens, in vLLM's order (decodes first, then prefills). Prefill batches straddle the
64-token chunk and alternate fresh sequences (their slot holds an earlier owner's garbage, which
must not leak in) with continuing ones (a later chunk of a chunked prefill: the slot's states are
read); decode steps continue every sequence; a mixed step holds both. Both pools are in-place
outputs compared whole (spare slots no sequence owns must come back unchanged). The CPU profile
keeps Qwen3-Next's hidden size and head dims (128) with 2 key and 4 value heads.
"""
import torch
from hypothesis import strategies as st

from fk_pytest import Case, standard_tests
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L2.qwen3_next_gated_delta_net import Qwen3NextGatedDeltaNet

from ..dense import DenseTask
from ..gated_delta_inputs import STATE_SCALE, decay_rates
from ..state_steps import StateTask
from ..linear_inputs import (GATED_DELTA_CHUNK, GATED_DELTA_MODELS, captured_layer_steps, draw_layer_step, gated_delta_dims,
                             layer_steps)
from ..workload import model_dtype


class Qwen3NextGatedDeltaNetTask(StateTask):
    name = "qwen3_next_gated_delta_net"
    level = 2
    family = "linear_attention"
    module_path = "L2/qwen3_next_gated_delta_net.py"
    reference = Qwen3NextGatedDeltaNet
    fuzz_dtypes = ("bf16",)  # the served dtype; the children's float32 paths are the L1 tasks' job

    def cases(self, profile):
        out = []
        for model in GATED_DELTA_MODELS:
            dt = model_dtype(model)
            steps = captured_layer_steps(model, profile, layer_steps(GATED_DELTA_CHUNK, profile))
            for name, context, query, weight, source in steps:
                out.append(Case(f"{model}-{name}-{DTYPE_NAMES[dt]}", dt, model=model, weight=weight,
                                params=dict(profile=profile, context=context, query=query, source=source)))
        return out

    def dims(self, case):
        return gated_delta_dims(case.model or GATED_DELTA_MODELS[0], case["profile"])

    def init_args(self, case):
        d = self.dims(case)
        return dict(hidden_size=d.hidden_size, num_k_heads=d.num_k_heads, num_v_heads=d.num_v_heads,
                    head_k_dim=d.head_k_dim, head_v_dim=d.head_v_dim, conv_kernel_size=d.conv_kernel,
                    rms_norm_eps=d.eps)

    def init_weights(self, module, gen):
        DenseTask.init_weights(self, module, gen)  # the projections at a trained network's scale
        dev = module.A_log.device
        with torch.no_grad():
            # Decay rates from slow (states living across many chunks) to fast, as trained heads have.
            module.A_log.copy_(decay_rates(module.A_log.numel(), gen, dev).log())
            module.dt_bias.copy_(0.5 * torch.randn(module.dt_bias.shape, generator=gen, device=dev))
            conv = module.conv1d.weight
            conv.copy_(0.5 * torch.randn(conv.shape, generator=gen, device=dev))
            # A plain weight around 1 (the gated norm is not zero-centred).
            module.norm.weight.copy_(1 + 0.2 * torch.randn(module.norm.weight.shape, generator=gen, device=dev))

    def state_shapes(self, case):
        d = self.dims(case)
        return (d.conv_kernel - 1, d.conv_dim), (d.num_v_heads, d.head_k_dim, d.head_v_dim), STATE_SCALE

    def make_inputs(self, case, gen, device):
        return self.layer_step_inputs(case, gen, device, self.dims(case).hidden_size)

    def fuzz_strategy(self, dtype, profile):
        @st.composite
        def draw_case(draw):
            context, query, ident = draw_layer_step(draw, profile, [1, 63, 64, 65])
            return Case(f"fuzz-{ident}-{DTYPE_NAMES[dtype]}", dtype, model=GATED_DELTA_MODELS[0],
                        params=dict(profile=profile, context=context, query=query))

        return draw_case()

    def io_bytes(self, case):
        d = self.dims(case)
        half = torch.finfo(case.dtype).bits // 8
        t, n = sum(case["query"]), len(case["query"])
        proj = 2 * d.key_dim + 2 * d.value_dim + 2 * d.num_v_heads
        weights = d.hidden_size * (proj + d.value_dim) * half
        continuing = sum(c > 0 for c in case["context"])
        state = d.num_v_heads * d.head_k_dim * d.head_v_dim * 4 + (d.conv_kernel - 1) * d.conv_dim * half
        return weights + 2 * t * d.hidden_size * half + (n + continuing) * state

    def flops(self, case):
        d = self.dims(case)
        t = sum(case["query"])
        proj = 2 * d.key_dim + 2 * d.value_dim + 2 * d.num_v_heads
        gemms = 2 * t * d.hidden_size * (proj + d.value_dim)
        # the conv taps, and per token and value head the delta rule's work on its K x V state
        return gemms + 2 * t * d.conv_dim * d.conv_kernel + 7 * t * d.num_v_heads * d.head_k_dim * d.head_v_dim


TASK = Qwen3NextGatedDeltaNetTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
