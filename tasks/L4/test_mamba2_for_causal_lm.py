"""Mamba2ForCausalLM (L4, vLLM): token ids in, logits out (``forward`` then ``compute_logits``
through the tied LM head), ``LAYERS`` layers deep (every layer is the same code; full depth is the
end-to-end level's), each layer with its own conv and SSM pools in place, one slot per sequence
shared by the layers. Steps as the layer task's (``tasks/mamba2_layers.py``); the CPU profile also
shards the vocabulary by 64 and runs the decode and mixed steps.
"""
import torch

from fk_pytest import standard_tests
from kernels_reference.L4.mamba2 import Mamba2ForCausalLM

from ..configs import load_config
from ..mamba2_layers import CPU_STEPS, Mamba2StackTask, arch_config, dims_of

LAYERS = 2


class Mamba2ModelTask(Mamba2StackTask):
    name = "mamba2_for_causal_lm"
    level = 4
    family = "model"  # as the other models' stacks
    module_path = "L4/mamba2.py"
    reference = Mamba2ForCausalLM
    state_layers = LAYERS
    # The mixed step holds a fresh and a continued prefill beside its decodes: the prefill-only
    # step adds nothing a two-layer stack could get wrong that the layer task does not already see.
    cpu_steps = [s for s in CPU_STEPS if not s[0].startswith("prefill")]
    # Full profile: the layer task's steps up to a few thousand tokens; every token's logits are an
    # output (a 32k-token step's float64 truth alone would be 13 GB), and the long prefills' scan
    # is the layer task's to time.
    FULL_SKIP = ("prefill-mixed", "prefill-long")

    def steps(self, chunk, profile):
        return [s for s in super().steps(chunk, profile) if s[0] not in self.FULL_SKIP]

    def extra_params(self, model, profile):
        shard = 64 if profile == "cpu" else 1
        return {"vocab": load_config(model)["vocab_size"] // shard}

    def init_args(self, case):
        return {"config": arch_config(case, LAYERS)}

    def make_inputs(self, case, gen, device):
        inputs = self.step_inputs(case, gen, device)
        inputs["positions"] = inputs["metadata"].positions()
        inputs["input_ids"] = torch.randint(0, case["vocab"], (sum(case["query"]),), generator=gen, device=device)
        return inputs

    def output_names(self, case):
        return ("logits",)

    def call(self, module, inputs, method=None):
        # The scored output is what the sampler reads: the logits of every token of the step.
        hidden_states = super().call(module, inputs, method)
        if method == "forward_native":
            return module.compute_logits(hidden_states, native=True)
        return module.compute_logits(hidden_states)

    def io_bytes(self, case):
        t, vocab, hidden = sum(case["query"]), case["vocab"], dims_of(case).hidden_size
        head = (vocab * hidden + t * vocab) * case.dtype.itemsize  # the tied table read once, logits out
        return LAYERS * self.layer_io_bytes(case) + head

    def flops(self, case):
        t, vocab, hidden = sum(case["query"]), case["vocab"], dims_of(case).hidden_size
        return LAYERS * self.layer_flops(case) + 2 * t * vocab * hidden


TASK = Mamba2ModelTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
