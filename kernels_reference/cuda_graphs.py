"""CUDA-graph capture that reports the operation which broke it.

When an operation inside ``torch.cuda.graph`` fails (a host sync, a pageable host copy, boolean
indexing), ending the broken capture raises its own error, "operation failed due to a previous
error during capture", and that error replaces the original one: the message no longer says which
operation, in which file, was not capturable. ``capture`` re-raises the original instead."""
import contextlib
from typing import Callable, Iterator, Optional, Sequence

import torch


@contextlib.contextmanager
def capture(graph: "torch.cuda.CUDAGraph", pool: Optional[tuple] = None) -> Iterator[None]:
    context = torch.cuda.graph(graph, pool=pool)
    context.__enter__()
    try:
        yield
    except BaseException as exc:
        try:
            context.__exit__(type(exc), exc, exc.__traceback__)
        except Exception:  # the capture's own end error: the original below says more
            pass
        raise
    context.__exit__(None, None, None)


def warm_up(calls: Sequence[Callable[[], object]], repeats: int = 1) -> None:
    """Run ``calls`` (``repeats`` times over) on a side stream and make the current stream wait for
    them: what a capture needs done first (compilation, autotuning, lazy workspaces and tables), off
    the stream a graph is then captured on."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(repeats):
            for call in calls:
                call()
    torch.cuda.current_stream().wait_stream(side)
