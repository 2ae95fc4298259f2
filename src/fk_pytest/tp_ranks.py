"""One job run on every rank of a tensor-parallel group: a spawned process per rank, joined by
``torch.distributed`` (gloo on the CPU, NCCL on GPUs, one device per rank), each inside
:func:`kernels_reference.parallel_state.tensor_parallel` for its rank.

``run_ranks(job, tp, payload, timeout_s)`` returns each rank's result in rank order. A rank that
raises ends the group: the others are stopped (they would wait in a collective for ever) and
:class:`RankFailure` names the rank and its error; ranks that do not finish within ``timeout_s``
are stopped and named the same way (status TIMEOUT). The job is a module-level function
``job(rank, tp, payload)`` (it is pickled by reference into the ranks); the payload and results
travel pickled, so tensors in them should be on the CPU.
"""
from __future__ import annotations

import io
import os
import queue
import tempfile
import time
import traceback
from typing import Any, Callable, List

from . import status


_CONTEXT = None


# What every rank imports before its job runs: torch, Triton (the kernels' language) and the suite's
# rank jobs with what they import (fk_pytest.evaluator resolves the task). The fork server imports
# them once with the environment of the process that started it, as each rank did before; the task's
# module and the candidate's still load in each rank, from their paths. In the README's main job on
# a 2-core CPU the seven tasks with tensor-parallel cases took 32 s of test time against 72 s when
# each rank imported these itself (the reports' per-task seconds, fresh clones of 11924a2 and
# ec2346e, docs/perf/cpu-tests-cost.md). A module missing here is imported by the rank instead
# (the server skips a module that fails to import).
RANK_PRELOAD = ["torch", "torch.distributed", "triton", "fk_pytest.evaluator", "fk_pytest.tp_eval",
                "fk_pytest.e2e_tp"]


def _context():
    """Processes forked from a fork server that imported what a rank needs once (``RANK_PRELOAD``):
    a rank then starts in tens of milliseconds instead of a second or more of imports (forking the
    evaluator itself is not safe once its OpenMP pool has run)."""
    global _CONTEXT
    if _CONTEXT is None:
        import torch.multiprocessing as mp
        _CONTEXT = mp.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(RANK_PRELOAD)
    return _CONTEXT


class RankFailure(Exception):
    def __init__(self, failure_status: str, message: str):
        super().__init__(message)
        self.status, self.message = failure_status, message


def _exit_with(watched: int) -> None:
    """A rank's watchdog: the rank ends itself once the process that started its group is gone (a
    sterile worker killed for its time limit would otherwise leave its ranks waiting in a
    collective, or for the all-done signal, for ever)."""
    import threading

    def watch():
        while True:
            time.sleep(1.0)
            try:
                os.kill(watched, 0)
            except OSError:
                os._exit(1)

    threading.Thread(target=watch, name="fk-rank-watchdog", daemon=True).start()


def _rank_main(rank: int, tp: int, init_file: str, backend: str, job, payload, results, done, parent: int) -> None:
    import torch
    import torch.distributed as dist

    from kernels_reference.parallel_state import tensor_parallel

    from .interpreter import patch_language_once

    _exit_with(parent)
    patch_language_once()  # interpreted kernels on CPU ranks (a no-op without TRITON_INTERPRET)
    torch.set_num_threads(1)  # tp ranks share the machine's cores
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=tp)
        with tensor_parallel(tp, rank):
            out = job(rank, tp, payload)
        # As bytes: a tensor sent through the queue as shared memory would vanish with this process.
        buffer = io.BytesIO()
        torch.save(out, buffer)
        results.put((rank, "ok", buffer.getvalue()))
        # Stay in the group until the parent has every rank's answer: a rank that left would make
        # a peer still inside a collective fail ("connection closed") instead of showing its hang.
        done.wait()
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the parent, named
        results.put((rank, "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(job: Callable[[int, int, Any], Any], tp: int, payload: Any, timeout_s: float,
              device: str = "cpu") -> List[Any]:
    ctx = _context()
    results, done = ctx.Queue(), ctx.Event()
    backend = "nccl" if device == "cuda" else "gloo"
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [ctx.Process(target=_rank_main, args=(r, tp, init_file, backend, job, payload, results, done, os.getpid()),
                             daemon=True)
                 for r in range(tp)]
        for p in procs:
            p.start()
        got, deadline = {}, time.monotonic() + timeout_s
        try:
            while len(got) < tp:
                try:
                    rank, kind, value = results.get(timeout=max(0.05, min(1.0, deadline - time.monotonic())))
                except queue.Empty:
                    if time.monotonic() >= deadline:
                        missing = sorted(set(range(tp)) - set(got))
                        raise RankFailure(status.TIMEOUT, f"rank(s) {missing} of {tp} did not finish within "
                                                          f"{timeout_s:.0f} s (a hang, e.g. a collective "
                                                          "the other ranks never join)")
                    dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in got]
                    if dead:
                        raise RankFailure(status.RUNTIME_ERROR, f"rank {dead[0]} of {tp} died "
                                                                f"(exit code {procs[dead[0]].exitcode})")
                    continue
                if kind == "error":
                    raise RankFailure(status.RUNTIME_ERROR, f"rank {rank} of {tp} raised {value}")
                got[rank] = _loaded(value)
        finally:
            done.set()
            for p in procs:
                p.join(timeout=2.0)
                if p.is_alive():
                    p.kill()
                    p.join()
    return [got[r] for r in range(tp)]


def _loaded(data: bytes):
    import torch
    return torch.load(io.BytesIO(data), weights_only=False)
