"""Call compatibility: a candidate class is accepted when the calls the suite really makes bind.

A kernel author writes the ordinary thing: a bare ``nn.Module`` subclass with only ``forward``, a
constructor with extra optional parameters, ``*args/**kwargs``. None of that differs from the
reference in a way a caller can see, so none of it is rejected. What is rejected is a call that
cannot bind: the constructor call the task makes (the reference's constructor arguments, passed by
keyword) and every ``forward`` call the task or a reference parent makes (checked as it happens,
with the real positional/keyword split), with ``inspect.Signature.bind``. A keyword-passed argument
must keep the reference's name. The message shows the call that failed.
"""
from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any, Dict, Optional, Sequence

import torch

from . import status
from .errors import CandidateError

_NO_ARGS = inspect.Signature()


def _effective_signature(cls: type, method: str) -> Optional[inspect.Signature]:
    """The signature a call to ``cls.<method>`` really faces, ``self`` removed.

    ``nn.Module.__init__`` (inherited by a class that defines no constructor) is declared
    ``(*args, **kwargs)`` but refuses any argument at run time: its effective signature is ``()``.
    """
    func = getattr(cls, method, None)
    if func is None:
        return None
    if method == "__init__" and func in (torch.nn.Module.__init__, object.__init__):
        return _NO_ARGS
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):  # a C-implemented callable: nothing to check against
        return None
    params = list(sig.parameters.values())
    if params and params[0].kind in (inspect.Parameter.POSITIONAL_ONLY,
                                     inspect.Parameter.POSITIONAL_OR_KEYWORD):
        params = params[1:]  # self
    return sig.replace(parameters=params)


def _describe_value(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).replace("torch.", "")
        return f"<{dtype} {list(value.shape)}>"
    if isinstance(value, (tuple, list)) and any(isinstance(v, torch.Tensor) for v in value):
        inner = ", ".join(_describe_value(v) for v in value)
        return f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def describe_call(owner: str, method: str, args: Sequence[Any], kwargs: Dict[str, Any]) -> str:
    parts = [_describe_value(a) for a in args] + [f"{k}={_describe_value(v)}" for k, v in kwargs.items()]
    call = owner if method == "__init__" else f"{owner}.{method}"
    return f"{call}({', '.join(parts)})"


def check_call(cls: type, method: str, args: Sequence[Any], kwargs: Dict[str, Any]) -> None:
    """Raise SIGNATURE_MISMATCH when ``cls.<method>(*args, **kwargs)`` cannot bind."""
    sig = _effective_signature(cls, method)
    if sig is None:
        return
    try:
        sig.bind(*args, **kwargs)
    except TypeError as exc:
        where = "nn.Module's (it takes no arguments)" if sig is _NO_ARGS else f"{method}{sig}"
        raise CandidateError(
            status.SIGNATURE_MISMATCH,
            f"{cls.__name__}.{method} is {where} and cannot take the call "
            f"{describe_call(cls.__name__, method, args, kwargs)}: {exc}") from None


def check_class(reference: type, cls: type) -> None:
    """What can be refused before any call: not a module, or no ``forward`` of its own."""
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise CandidateError(status.SIGNATURE_MISMATCH,
                             f"{cls.__name__} is not a torch.nn.Module subclass (the reference's "
                             f"state_dict must load into it)")
    forward = getattr(cls, "forward", None)
    if forward is None or forward is torch.nn.Module.forward:
        raise CandidateError(status.SIGNATURE_MISMATCH, f"{cls.__name__} defines no forward")
    if only_raises_not_implemented(forward):
        raise CandidateError(status.NOT_IMPLEMENTED,
                             f"{cls.__name__}.forward only raises NotImplementedError: a stub still to fill in")


def only_raises_not_implemented(fn) -> bool:
    """Whether ``fn``'s body, its docstring aside, is one ``raise NotImplementedError[(...)]``.

    Read from the source, so a stub is known before any input is built for it (a stub tree then
    costs what collecting it costs); a body that raises NotImplementedError on some paths only is
    not a stub, and its calls that raise are the cases' NOT_IMPLEMENTED instead."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):  # no source to read (built in, generated): run it
        return False
    if not tree.body or not isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    body = tree.body[0].body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or body[0].exc is None:
        return False
    raised = body[0].exc.func if isinstance(body[0].exc, ast.Call) else body[0].exc
    return isinstance(raised, ast.Name) and raised.id == "NotImplementedError"


def construct(cls: type, init_args: Dict[str, Any], device=None) -> torch.nn.Module:
    """``cls(**init_args)`` after checking that the call binds, built on ``device`` (default: the
    host); constructor failures are the candidate's RUNTIME_ERROR."""
    check_call(cls, "__init__", (), init_args)
    try:
        return _built_on(cls, init_args, device)
    except NotImplementedError as exc:
        raise CandidateError(status.NOT_IMPLEMENTED, f"{describe_call(cls.__name__, '__init__', (), init_args)} "
                                                     f"raised NotImplementedError: {exc}") from exc
    except Exception as exc:
        raise CandidateError(status.RUNTIME_ERROR, f"{describe_call(cls.__name__, '__init__', (), init_args)} "
                                                   f"raised {type(exc).__name__}: {exc}") from exc


def install_call_checks(module: torch.nn.Module) -> None:
    """Check every call into ``module.forward`` as it happens (a forward pre-hook).

    Each distinct call pattern (positional count, keyword names) is bound once; a call that cannot
    bind raises SIGNATURE_MISMATCH naming the class and showing the call, instead of a TypeError
    from deep inside the caller. The hook is removed by :func:`remove_call_checks` before timing.
    """
    cls = type(module)
    seen = set()

    def hook(mod, args, kwargs):
        key = (len(args), tuple(kwargs))
        if key not in seen:
            check_call(cls, "forward", args, kwargs)
            seen.add(key)
        return None

    handles = getattr(module, "_fk_call_checks", [])
    handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
    object.__setattr__(module, "_fk_call_checks", handles)


def remove_call_checks(root: torch.nn.Module) -> None:
    for m in root.modules():
        for handle in getattr(m, "_fk_call_checks", []):
            handle.remove()
        if hasattr(m, "_fk_call_checks"):
            object.__delattr__(m, "_fk_call_checks")


def _built_on(cls: type, init_args: Dict[str, Any], device) -> torch.nn.Module:
    """Built where it will run, as production builds a model and as the reference is built: a
    full-size module built on the host first is then copied to the GPU (Mixtral's 2-layer float32
    cut: 12 GB, about 4 s a build on the H200, 2026-12-03, docs/perf/h200-suite-cost.md). A
    constructor that works only on the host (numpy on a default-device tensor, say) is built there
    and moved by the caller."""
    if device is None or torch.device(device).type == "cpu":
        return cls(**init_args)
    try:
        with torch.device(device):
            return cls(**init_args)
    except NotImplementedError:
        raise
    except Exception:
        return cls(**init_args)
