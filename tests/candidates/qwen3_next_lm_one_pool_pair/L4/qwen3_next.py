# WRONG: the three linear-attention layers share the first layer's pool pair (one state per
# sequence for the model, not one per layer): each layer overwrites the slot the next one reads.
from kernels_reference.L4.qwen3_next import Qwen3NextForCausalLM as _Reference


class Qwen3NextForCausalLM(_Reference):
    def forward(self, input_ids, positions):
        layers = self.state_layers()
        for layer in layers[1:]:
            layer.state_cache = layers[0].state_cache
        return super().forward(input_ids, positions)
