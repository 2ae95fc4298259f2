"""Qwen3NextForCausalLM (L4): token ids and positions in, final hidden states out, over one engine
step with every layer's memory bound: the gated DeltaNet layers' conv and recurrent-state pools and
the attention layer's paged K/V cache, all inputs and in-place outputs (``tasks/qwen3_next_layers.py``).

Depth: 4 layers, [linear, linear, linear, full], not the suite's usual 2 (``LAYERS``): two layers
cannot hold Qwen3-Next's 3 : 1 pattern of gated DeltaNet and full-attention layers, and the pattern
is what the model is (a state carried through three scans feeds the attention layer). The CPU
profile is the layer task's cut (hidden 256, 64 experts top-10, 2 / 4 linear heads of 128, 2 / 1
attention heads of 256) with the vocabulary sharded by 64; the full profile is the real widths and
vocabulary on steps whose prefill chunks are at most 256 tokens (``model_steps`` says why; no
captured workload yet).

Scored in float32 (``float32_cases``, as the other MoE models): in bf16 the rounding of four layers
moves the last routers' logits past the gap between the 10th and 11th expert of many tokens. The
routing rule follows an undetermined token through the later layers: its sequence's later rows, the
attention layer's K/V rows of those tokens and the linear layers' state slots of that sequence
(``hybrid_model_rule``).
"""
import torch

from fk_pytest import standard_tests
from kernels_reference.L4.qwen3_next import Qwen3NextForCausalLM

from ..linear_inputs import GATED_DELTA_MODELS
from ..moe import float32_cases
from ..paged import PagedTask
from ..qwen3_next_layers import (PATTERN_LAYERS, Qwen3NextStackTask, hybrid_model_rule, layer_flops,
                                 layer_weight_bytes, model_steps, step_case)
from ..state_steps import StateTask
from ..workload import model_dtype


class Qwen3NextModelTask(Qwen3NextStackTask, StateTask, PagedTask):
    name = "qwen3_next_for_causal_lm"
    level = 4
    family = "model"
    module_path = "L4/qwen3_next.py"
    reference = Qwen3NextForCausalLM
    state_layers = PATTERN_LAYERS - 1  # the linear-attention layers, in layer order
    layers = 1  # the full-attention layer's K/V cache pair
    undetermined_rows = hybrid_model_rule
    fuzz_dtypes = ("fp32",)  # see float32_cases

    def cases(self, profile):
        shard = 64 if profile == "cpu" else 1
        out = [step_case(model, name, seqs, model_dtype(model), dict(profile=profile, vocab_shard=shard))
               for model in GATED_DELTA_MODELS for name, seqs in model_steps(profile)]
        return float32_cases(out)

    def init_args(self, case):
        return {"config": self.config(case)}

    def make_inputs(self, case, gen, device):
        inputs = self.add_state_pools(case, self.metadata_and_caches(case, gen, device), gen, device)
        inputs["positions"] = inputs["metadata"].positions()
        inputs["input_ids"] = torch.randint(0, self.config(case).vocab_size, (sum(case["query"]),),
                                            generator=gen, device=device)
        return inputs

    def output_names(self, case):
        return ("hidden_states",)

    def io_bytes(self, case):
        c = self.config(case)
        es = torch.finfo(case.dtype).bits // 8
        embed = sum(case["query"]) * c.hidden_size * es  # the rows gathered, not the whole table
        layers = sum(layer_weight_bytes(c, case, kind) for kind in c.layer_types)
        return self.attention_io(case) + layers + embed

    def flops(self, case):
        c = self.config(case)
        return self.attention_flops(case) + sum(layer_flops(c, case, kind) for kind in c.layer_types)


TASK = Qwen3NextModelTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
