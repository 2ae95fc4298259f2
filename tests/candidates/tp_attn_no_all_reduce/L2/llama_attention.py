"""Wrong at tensor parallelism only: the output projection's partial products are never all-reduced
(``reduce_results=False`` left on from a fused all-reduce + norm path), so each rank returns its own
heads' share of the hidden state."""
from kernels_reference.L2.llama_attention import LlamaAttention as _Reference


class LlamaAttention(_Reference):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.o_proj.reduce_results = False
