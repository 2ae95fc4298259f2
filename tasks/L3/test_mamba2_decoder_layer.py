"""Mamba2DecoderLayer (L3, vLLM): the RMSNorm with the residual add fused, then Mamba-2's mixer,
``(hidden_states, residual) -> (hidden_states, residual)``, over engine steps with the layer's conv
and SSM pools in place (prefill mixing fresh and continued sequences, decode, mixed; see
``tasks/mamba2_layers.py``). mamba2-2.7b's layer; the CPU profile has 4 of its 80 heads.
"""
from fk_pytest import standard_tests
from kernels_reference.L3.mamba2_decoder_layer import Mamba2DecoderLayer

from ..mamba2_layers import Mamba2StackTask, arch_config, dims_of
from ..workload import activations


class Mamba2DecoderLayerTask(Mamba2StackTask):
    name = "mamba2_decoder_layer"
    level = 3
    family = "layer"  # as the other models' layers
    module_path = "L3/mamba2_decoder_layer.py"
    reference = Mamba2DecoderLayer
    captured_steps = True

    def init_args(self, case):
        return {"config": arch_config(case)}

    def make_inputs(self, case, gen, device):
        inputs = self.step_inputs(case, gen, device)
        shape = (sum(case["query"]), dims_of(case).hidden_size)
        inputs["hidden_states"] = activations(shape, gen, device, case.dtype)
        # The residual stream grows over the layers: larger than one block's output.
        inputs["residual"] = activations(shape, gen, device, case.dtype, scale=4.0)
        return inputs

    def output_names(self, case):
        return ("hidden_states", "residual")

    def io_bytes(self, case):
        # the mixer's traffic, the norm's weight, and the residual read and written
        act = 2 * sum(case["query"]) * dims_of(case).hidden_size * case.dtype.itemsize
        return self.layer_io_bytes(case) + act

    def flops(self, case):
        return self.layer_flops(case)


TASK = Mamba2DecoderLayerTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
