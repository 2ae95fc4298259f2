"""Paged attention for ``L1/attention.py``: the native forms (native.py), the CUDA fast path
(fast.py: Triton KV store, Triton split-K decode, prefill), cuDNN's two-pass prefill
(two_pass_prefill.py, merged by merge_partials.py) and SDPA prefill (sdpa_prefill.py).
"""
