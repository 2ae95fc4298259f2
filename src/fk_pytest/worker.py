"""Run the :class:`~fk_pytest.evaluator.Evaluator` in a child process, with a time limit.

The parent (the pytest session, which records results and writes the report) never imports
candidate code. Each request is pickled over a socket pair; if the child dies (segfault, abort
from a corrupted heap, a CUDA fault that took the context down) or does not answer within the
time limit, the request ends as RUNTIME_ERROR / TIMEOUT and the next request starts a fresh
child. After a request that left the child unusable (a sticky CUDA error, patched timers, an
out-of-memory failure or GPU memory its allocator cannot give back) the child says so and exits,
so nothing leaks into the next task.
"""
from __future__ import annotations

import atexit
import os
import signal
import sys
import time
import traceback
import weakref
from multiprocessing.connection import Connection
from typing import Any, Callable, Optional

from . import status


class WorkerFailure(Exception):
    def __init__(self, failure_status: str, message: str):
        super().__init__(message)
        self.status = failure_status
        self.message = message


def _describe_exit(code: Optional[int]) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


_CONTEXT = None


def _worker_context():
    """Workers fork from a server process that imported torch once (most of a fresh Python's
    start-up here): a restart after a crash or a hang costs a fork and the suite's own imports,
    not another second and a half of torch. The server imports nothing else (no CUDA context, no
    Triton kernels, no suite or candidate code), so every worker starts as clean as a new process."""
    global _CONTEXT
    if _CONTEXT is None:
        import multiprocessing
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(["torch", "torch.distributed"])
    return _CONTEXT


_LIVE = weakref.WeakSet()  # forked workers not yet closed


@atexit.register
def _kill_live_workers() -> None:
    """Workers are not daemons (a worker starts tensor-parallel ranks of its own), so
    multiprocessing would wait for any still running when this process exits; a session closes
    its worker, and one left behind (an interrupted run) is killed here instead of waited for."""
    for child in list(_LIVE):
        if child.process.exitcode is None:
            child.process.kill()


class _Child:
    """A forked worker seen through the part of ``subprocess.Popen`` the client uses."""

    def __init__(self, process):
        self.process = process
        _LIVE.add(self)

    def poll(self) -> Optional[int]:
        return self.process.exitcode

    def kill(self) -> None:
        self.process.kill()

    def wait(self) -> Optional[int]:
        self.process.join()
        return self.process.exitcode


class WorkerClient:
    """Parent side. Methods mirror Evaluator's: load, evaluate, speed."""

    def __init__(self, candidate: Optional[str], device: str, timeout_s: float, mode: str = "independent",
                 progress: Optional[Callable[[str], None]] = None, env: Optional[dict] = None,
                 thorough: bool = False):
        self.candidate, self.device, self.timeout_s, self.mode = candidate, device, timeout_s, mode
        self.thorough = thorough
        self.progress = progress  # phases of long requests, as the worker reports them
        self.env = env  # extra environment of the child (e.g. CUDA_VISIBLE_DEVICES of an xdist worker)
        self.proc: Optional[_Child] = None
        self.conn: Optional[Connection] = None

    def _start(self) -> None:
        spawned_at = time.time()
        ctx = _worker_context()
        parent_conn, child_conn = ctx.Pipe()
        # The environment as this process has it now (the fork server's is its own from when it
        # started): the child takes it over before it imports anything but torch.
        process = ctx.Process(target=serve_forked, args=(child_conn, {**os.environ, **(self.env or {})}),
                              name="fk-worker")
        process.start()
        child_conn.close()
        self.proc, self.conn = _Child(process), parent_conn
        self.conn.send({"sys_path": list(sys.path), "candidate": self.candidate, "device": self.device,
                        "mode": self.mode, "spawned_at": spawned_at,
                        "thorough": self.thorough})

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except OSError:
                pass
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = self.conn = None

    def call(self, op: str, *args: Any) -> Any:
        if self.proc is None:
            self._start()
        deadline = time.monotonic() + self.timeout_s
        try:
            self.conn.send((op, args))
            while True:
                if not self.conn.poll(max(0.0, deadline - time.monotonic())):
                    self.close()
                    raise WorkerFailure(status.TIMEOUT, f"no answer within {self.timeout_s:g} s "
                                        "(--fk-timeout); the worker was killed")
                reply = self.conn.recv()
                if reply[0] != "progress":
                    break
                if self.progress is not None:
                    self.progress(reply[1])
        except (EOFError, OSError, BrokenPipeError):
            code = self.proc.wait() if self.proc else None
            self.close()
            raise WorkerFailure(status.RUNTIME_ERROR,
                                f"the worker running the candidate {_describe_exit(code)} "
                                "(a crash in candidate code: segfault, heap corruption, CUDA fault)")
        kind, value, restart = reply
        if restart:
            self.close()
        if kind == "ok":
            return value
        raise _rebuild(kind, value)

    def load(self, ref):
        return self.call("load", ref)

    def evaluate(self, ref, case, seed, kind):
        return self.call("evaluate", ref, case, seed, kind)

    def speed(self, ref, case, seed):
        return self.call("speed", ref, case, seed)

    def e2e(self, ref, case):
        return self.call("e2e", ref, case)


def _rebuild(kind: str, value):
    from .errors import CandidateError, TaskDefinitionError
    if kind == "candidate_error":
        return CandidateError(*value)
    if kind == "task_error":
        return TaskDefinitionError(value)
    return WorkerFailure(status.RUNTIME_ERROR, value)


# ---- child side -----------------------------------------------------------------------------------
def _context_broken(device: str) -> bool:
    from .guards import tampered
    if tampered():
        return True
    if device == "cuda":
        import torch
        try:
            torch.cuda.synchronize()
        except Exception:
            return True
    return False


STUCK_BYTES = 32 << 30  # GPU memory the allocator keeps but cannot give back, past which a child restarts


def _memory_stuck(device: str, reply) -> bool:
    """After an out-of-memory failure, or when the caching allocator holds more than STUCK_BYTES
    it cannot return (big segments of a full-size case pinned by a few tensors that outlived it),
    the next request gets a fresh child with the whole GPU: otherwise one case that ran out of
    memory makes every later case of the run fail the same way (seen on the H200, 2026-12-04)."""
    if device != "cuda":
        return False
    if reply[0] != "ok" and "out of memory" in str(reply[1]).lower():
        return True
    import torch
    from .build import release_memory
    if torch.cuda.memory_reserved() - torch.cuda.memory_allocated() <= STUCK_BYTES:
        return False
    release_memory()
    return torch.cuda.memory_reserved() - torch.cuda.memory_allocated() > STUCK_BYTES


def serve_forked(conn, environ: dict) -> None:
    """A forked worker's entry: this run's environment first (the plugin passes --fk-cache-dir and
    an xdist worker's device through it), then the requests."""
    os.environ.clear()
    os.environ.update(environ)
    serve_connection(conn)


def serve(fd: int) -> None:
    serve_connection(Connection(fd))


def serve_connection(conn) -> None:
    init = conn.recv()
    sys.path[:] = init["sys_path"]
    # Import the whole suite machinery, then record what is genuine, before any candidate code.
    from . import correctness, evaluator, guards, speed, timing  # noqa: F401
    from .errors import CandidateError, TaskDefinitionError
    if init["device"] == "cpu":
        from .interpreter import patch_language_once
        from .xdist import share_cpu_threads
        patch_language_once()
        share_cpu_threads()
    guards.genuine_snapshot()
    ev = evaluator.Evaluator(init["candidate"], init["device"], init["mode"], thorough=init.get("thorough", False),
                             progress=lambda text: conn.send(("progress", text, False)))
    from . import phases  # the start-up is billed to the first result after it
    phases.add("worker_start", time.time() - init.get("spawned_at", time.time()))
    while True:
        try:
            op, args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            reply = ["ok", getattr(ev, op)(*args)]
        except CandidateError as exc:
            reply = ["candidate_error", (exc.status, exc.message)]
        except TaskDefinitionError as exc:
            reply = ["task_error", str(exc)]
        except BaseException as exc:  # candidate code failing while timed, or a suite bug
            lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
            reply = ["error", f"{type(exc).__name__}: {exc}\n{''.join(lines[-3:]).strip()}"]
        restart = _context_broken(init["device"]) or _memory_stuck(init["device"], reply)
        conn.send((*reply, restart))
        if restart:
            conn.close()
            os._exit(0)

