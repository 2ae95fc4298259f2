"""What would stop a CUDA-graph capture, seen on the CPU: ``with HostSyncCheck(): module(...)``
raises ``NotCapturable`` at the first operation that reads device values on the host (see the
class). For candidate authors before a GPU run, and for the suite's own tests of the example tree."""
import contextlib
import os

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode


class NotCapturable(RuntimeError):
    """An operation that a CUDA-graph capture cannot run (it reads device values on the host)."""


def _syncing_ops() -> frozenset:
    aten = torch.ops.aten
    names = ("_local_scalar_dense", "nonzero", "masked_select", "equal", "is_nonzero", "bincount", "unique",
             "_unique", "_unique2", "unique_consecutive", "unique_dim")
    return frozenset(getattr(aten, n) for n in names if hasattr(aten, n))


def _bool_index(indices) -> bool:
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())


# Tensor methods that hand device values to Python without an aten op the dispatch mode sees
# (on a CPU tensor they read memory directly).
_SYNCING_METHODS = frozenset(("tolist", "numpy", "item", "__int__", "__float__", "__bool__", "__index__"))


def _caller() -> str:
    """The innermost frame outside torch, contextlib and this module: the line that asked for the read."""
    import traceback

    skip = (os.path.dirname(torch.__file__) + os.sep, contextlib.__file__, __file__)
    for frame in reversed(traceback.extract_stack()[:-1]):
        if not frame.filename.startswith(skip):
            return f"{frame.filename}:{frame.lineno}"
    return ""


def _refuse(what: str, where: str):
    where = ", ".join(p for p in (where, _caller()) if p)
    raise NotCapturable(f"{what} reads device values on the host, which a CUDA-graph capture cannot do"
                        + (f" ({where})" if where else ""))


class _SyncingOps(TorchDispatchMode):
    def __init__(self, where: str):
        super().__init__()
        self.where = where
        self._syncing = _syncing_ops()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        packet = func.overloadpacket
        aten = torch.ops.aten
        if packet in self._syncing:
            _refuse(packet.__name__, self.where)
        if packet in (aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_) and \
                _bool_index(args[1] if len(args) > 1 else ()):
            _refuse(f"{packet.__name__} with a boolean mask", self.where)
        return func(*args, **(kwargs or {}))


class _SyncingMethods(TorchFunctionMode):
    def __init__(self, where: str):
        super().__init__()
        self.where = where

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in _SYNCING_METHODS:
            _refuse(f"Tensor.{name}", self.where)
        return func(*args, **(kwargs or {}))


class HostSyncCheck(contextlib.ExitStack):
    """Raises ``NotCapturable`` on an operation that would stop a CUDA-graph capture because it
    reads device values on the host: ``.item()``/``.tolist()``/``.numpy()``/``int(t)``/``if t:``,
    ``nonzero``, boolean-mask indexing and assignment, ``masked_select``, ``unique``, ``bincount``,
    ``torch.equal``. On the CPU nothing syncs, so this is how a CPU run sees what would break a
    decode graph on the GPU (copies from pageable host memory, the other kind, it cannot see).
    The message names ``where`` and the line of code that asked for the read."""

    def __init__(self, where: str = ""):
        super().__init__()
        self.where = where

    def __enter__(self):
        super().__enter__()
        self.enter_context(_SyncingMethods(self.where))
        self.enter_context(_SyncingOps(self.where))
        return self
