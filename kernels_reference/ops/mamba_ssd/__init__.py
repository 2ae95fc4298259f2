"""Mamba-2's selective state space kernels: the chunked SSD scan of prefill (chunk_scan.py), the
decode state update (state_update.py) and the token-by-token recurrence both are checked against
(native.py).
"""
