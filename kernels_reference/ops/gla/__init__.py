"""Gated linear attention (GLA) of ``L1/gla.py``: its definition (native.py, the token-by-token
recurrence), the chunked Triton kernels of prefill (chunk.py) and the recurrent Triton kernel of
decode (recurrent.py)."""
