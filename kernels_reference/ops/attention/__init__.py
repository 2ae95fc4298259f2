"""Paged attention for ``L1/attention.py``: the native forms (native.py), the CUDA fast path
(fast.py: Triton KV store, Triton split-K decode, SDPA prefill) and SDPA prefill (sdpa_prefill.py).
"""
