"""The gated delta rule of ``L1/gated_delta_rule.py``: its definition (native.py, the token-by-token
recurrence), the chunked Triton kernels of prefill (chunk.py) and the recurrent Triton kernel of
decode (recurrent.py)."""
