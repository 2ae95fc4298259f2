"""Triton's CPU interpreter with ``triton.language`` patched once per process, not once per call.

Under ``TRITON_INTERPRET=1`` a kernel launch (the interpreter's ``GridExecutor``) patches the
builtins of ``triton.language`` with interpreted versions (a scan of the modules with
``inspect.getmembers`` and a wrapper per builtin) and restores the originals at its end; every call
from one ``@triton.jit`` function to another inside it (``tl.sum``, ``tl.max``, a kernel's helpers)
patches again and never restores that. On the CPU machine (2026-12-07, Triton 3.9) one patch and
its restore took 0.43 ms, 60% of a trivial launch (0.74-0.82 ms; 0.36 ms with the patch kept);
the example tree's RMSNorm launch at SmolLM2's decode size went from 4.3 to 3.2 ms with it kept.
Before 2026-12-07 the nested patches had been a third of an engine step of the fused decode.

``patch_language_once`` patches each language module (``triton.language`` or
``triton.language.core``, as a kernel's module names them) the first time a launch or a nested
call needs it, and keeps the patch for the rest of the process: later patches of covered modules
are no-ops, and a launch's restore restores nothing. The interpreted functions are Triton's own,
so every result is what Triton's interpreter computes. Keeping them is safe where this is
installed: in a process whose kernels all run interpreted (the plugin on the CPU, its CPU workers
and tensor-parallel ranks) nothing calls the compiled language. (Launches from two threads at once
are no safer than in Triton's own interpreter, whose grid index is one global: with a switch
interval of 1 us, two threads' launches computed wrong rows with and without this patch.)
Installed only when the interpreter is on and has the structure described here; otherwise it
changes nothing.
"""
from __future__ import annotations

import os
import threading

_INSTALLED = False


def _interpreter_module():
    try:
        from triton.runtime import interpreter
    except Exception:  # no Triton, or one without an interpreter: nothing to speed up
        return None
    if not hasattr(interpreter, "_patch_lang"):
        return None
    return interpreter


class _KeptPatch:
    """The patch scope a launch gets: its ``restore`` keeps the language patched."""

    def restore(self) -> None:
        pass


def patch_language_once() -> bool:
    """Install once per process when the interpreter is on; True when it is in place."""
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
    lock = threading.Lock()
    covered = set()  # ids of the language modules patched for good
    kept = _KeptPatch()

    def language_modules(fn) -> frozenset:
        # What Triton's own _patch_lang patches for fn: triton.language or its core, as fn's
        # module names them.
        return frozenset(id(value) for value in fn.__globals__.values() if value is tl or value is tl.core)

    def patch_lang_for_good(fn):
        langs = language_modules(fn)
        if langs and langs <= covered:
            return kept
        with lock:
            if not (langs and langs <= covered):
                patch_lang(fn)  # Triton's patch (and its error for a function that sees no language); never restored
                covered.update(langs)
        return kept

    patch_lang_for_good.__wrapped__ = patch_lang
    interpreter._patch_lang = patch_lang_for_good
    _INSTALLED = True
    return True
