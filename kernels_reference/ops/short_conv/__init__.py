"""The kernels of ``L1/short_convolution.py``: the causal depthwise convolution over packed
variable-length sequences with per-sequence conv states in a slot pool (``native.py``, the semantic
definition; ``kernels.py``, the Triton prefill, state write-back and decode kernels).
"""
