"""Triton's CPU interpreter without its redundant re-patching of ``triton.language``.

Under ``TRITON_INTERPRET=1`` a kernel launch (the interpreter's ``GridExecutor``) patches the
builtins of ``triton.language`` with interpreted versions for the launch's duration and restores
them at its end. Every call from one ``@triton.jit`` function to another inside that launch
(``tl.sum``, ``tl.max``, ``tl.cdiv``, a kernel's own helpers) patches them again (scanning the
modules with ``inspect.getmembers``) and never restores that second patch: it finds the launch's
patch in place and sets the same interpreted functions again. On the CPU machine (2026-12-07,
Triton 3.9) that re-patching was about a third of an interpreted engine step's time (8928 patches
for 108 launches in ``tests/test_fused_decode.py``'s default case, under cProfile).

``skip_nested_repatching`` makes a nested call's patch a no-op while the modules the called function
sees (``triton.language`` or ``triton.language.core``, as its module names them) are already patched
in the launch it runs in, by the launch itself or by an earlier nested call (whose patch Triton never
restores); a function that sees another one (or none: the interpreter's own error for that stays) is
patched as before. The patched state, and so every result, is the one Triton's interpreter would
have; only the redundant scans go. It is installed only where the interpreter runs (the plugin on
the CPU, its CPU workers and tensor-parallel ranks) and only when the interpreter has the structure
described here; otherwise it changes nothing.
"""
from __future__ import annotations

import functools
import os
import threading

_INSTALLED = False


def _interpreter_module():
    try:
        from triton.runtime import interpreter
    except Exception:  # no Triton, or one without an interpreter: nothing to speed up
        return None
    needed = ("_patch_lang", "GridExecutor", "InterpretedFunction")
    if not all(hasattr(interpreter, name) for name in needed):
        return None
    return interpreter


def skip_nested_repatching() -> bool:
    """Install the skip once per process when the interpreter is on; True when it is in place."""
    global _INSTALLED
    if _INSTALLED:
        return True
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        return False
    interpreter = _interpreter_module()
    if interpreter is None:
        return False
    import triton.language as tl

    patch_lang = interpreter._patch_lang
    launch_call = interpreter.GridExecutor.__call__
    local = threading.local()  # per thread: a launch in one thread says nothing of another's

    def state():
        if not hasattr(local, "state"):
            local.state = {"launch_pending": False, "covered": None}
        return local.state

    def language_modules(fn) -> frozenset:
        # The modules Triton's own _patch_lang patches for fn: triton.language or its core, as fn's
        # module names them.
        return frozenset(id(value) for value in fn.__globals__.values() if value is tl or value is tl.core)

    @functools.wraps(patch_lang)
    def patch_lang_once(fn):
        now = state()
        if now["launch_pending"]:  # the launch's own patch, which it restores at its end
            now["launch_pending"] = False
            scope = patch_lang(fn)
            now["covered"] = language_modules(fn)
            return scope
        covered = now["covered"]
        langs = language_modules(fn)
        if covered is not None and langs and langs <= covered:
            return None  # a nested call: the launch's patch already covers what fn sees
        scope = patch_lang(fn)
        if covered is not None:  # Triton never restores a nested call's patch: it holds to the launch's end
            now["covered"] = covered | langs
        return scope

    @functools.wraps(launch_call)
    def launch(self, *args, **kwargs):
        now = state()
        saved = dict(now)
        now["launch_pending"], now["covered"] = True, None
        try:
            return launch_call(self, *args, **kwargs)
        finally:
            now.update(saved)

    interpreter._patch_lang = patch_lang_once
    interpreter.GridExecutor.__call__ = launch
    _INSTALLED = True
    return True
