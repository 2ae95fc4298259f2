"""Zeroed int32 counters that kernels leave at zero again, kept per device and owner.

Kernels that coordinate their programs inside one launch (the paged decode's fused merge) count
with atomics in a small global buffer. Every launch leaves its counters at zero again (the program
that counts last resets them), so one buffer serves every later launch and every replay of a
captured CUDA graph without a fill between them. Each owner gets its own buffer,
so two ops never share a counter.
"""
import torch

_BUFFERS: dict = {}


def zeroed_counters(device: torch.device, needed: int, owner: str) -> torch.Tensor:
    """At least ``needed`` zeroed int32 counters for ``owner`` on ``device``. A buffer first needed
    inside a CUDA-graph capture is not cached: its zero fill is then a node of the graph (it would
    not have run yet when the capture ends)."""
    key = (owner, device)
    buf = _BUFFERS.get(key)
    if buf is not None and buf.numel() >= needed:
        return buf
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    buf = torch.zeros(max(needed, 1024), dtype=torch.int32, device=device)
    if not capturing:
        _BUFFERS[key] = buf
    return buf


def counters_left_zero(owner: str) -> bool:
    """Whether every buffer of ``owner`` is back at zero (what each launch must leave behind)."""
    return all(int(torch.count_nonzero(buf)) == 0 for (who, _), buf in _BUFFERS.items() if who == owner)
