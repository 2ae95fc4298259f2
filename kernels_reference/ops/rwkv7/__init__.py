"""RWKV-7's time-mix core of ``L1/rwkv7.py``: its definition (native.py, the token-by-token
recurrence) and the recurrent Triton kernel (recurrent.py) that serves prefill and decode."""
