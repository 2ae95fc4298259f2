"""``triton.language`` patched once per process (fk_pytest.interpreter): launches after the first
patch nothing however many nested calls they make, and compute bit for bit what Triton's own
interpreter computes."""
import os
import subprocess
import sys
import threading
from unittest import mock

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

from conftest import _suite_env  # noqa: E402
from fk_pytest.interpreter import patch_language_once  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") in ("", "0"),
                                reason="the Triton interpreter is off (a GPU run)")


@triton.jit
def _scaled_row_max(x, scale):
    return tl.max(x, axis=0) * scale


@triton.jit
def _rows_kernel(x_ptr, out_ptr, n_cols, STEPS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=0.0)
    acc = tl.zeros((), dtype=tl.float32)
    for step in range(STEPS):  # nested calls per step: tl.sum, tl.max (jit functions) and a helper
        acc += tl.sum(x * (step + 1), axis=0) + _scaled_row_max(x, 0.5)
    tl.store(out_ptr + row, acc)


def _run(x, steps):
    out = torch.empty(x.shape[0], dtype=torch.float32)
    _rows_kernel[(x.shape[0],)](x, out, x.shape[1], STEPS=steps, BLOCK=16)
    return out


def _expected(x, steps):
    return sum(x.sum(1) * (s + 1) + x.max(1).values * 0.5 for s in range(steps))


def _patches_of_one_launch(x, steps):
    with mock.patch.object(interpreter, "_patch_builtin", wraps=interpreter._patch_builtin) as spy:
        _run(x, steps)
    return spy.call_count


# Triton's own interpreter, in a process where nothing is installed: this file's kernel on the
# same input, saved for the comparison.
_TRITON_OWN = """
import importlib.util, os, sys, torch
sys.path.insert(0, os.path.dirname(sys.argv[1]))  # the test file's own imports (its conftest)
spec = importlib.util.spec_from_file_location("kernels_under_test", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
from triton.runtime import interpreter
assert not hasattr(interpreter._patch_lang, "__wrapped__"), "the patch-once is installed here"
torch.save(module._run(torch.load(sys.argv[2]), 8), sys.argv[3])
"""


def test_later_launches_patch_nothing_and_compute_what_triton_computes(tmp_path):
    assert patch_language_once()  # the plugin installed it on the CPU; a second call keeps it
    x = torch.randn(3, 13)
    _run(x, 1)  # the first launch (here or earlier in the process) patches the language for good
    assert _patches_of_one_launch(x, 2) == 0
    assert _patches_of_one_launch(x, 8) == 0
    got = _run(x, 8)
    torch.testing.assert_close(got, _expected(x, 8))
    torch.save(x, tmp_path / "x.pt")
    env = dict(_suite_env(), TRITON_INTERPRET="1")
    subprocess.run([sys.executable, "-c", _TRITON_OWN, __file__, str(tmp_path / "x.pt"), str(tmp_path / "own.pt")],
                   check=True, env=env, timeout=300)
    assert torch.equal(got, torch.load(tmp_path / "own.pt"))


def test_the_language_stays_patched_after_a_launch():
    _run(torch.randn(2, 5), 2)
    # Triton's own launch would have put the builtins back; here the interpreted ones stay.
    assert not tl.core.is_builtin(tl.load) and not tl.core.is_builtin(tl.program_id)
    assert interpreter._patch_lang(_rows_kernel.fn).restore() is None  # a covered module: nothing to undo
    assert not tl.core.is_builtin(tl.load)


def test_a_launch_from_another_thread_computes_the_same():
    """The patch is the process's, not a thread's: a kernel launched from a worker thread (as a
    candidate's background work may) finds the language patched and computes the same."""
    x = torch.randn(4, 9)
    got = {}
    worker = threading.Thread(target=lambda: got.setdefault("out", _run(x, 3)))
    worker.start()
    worker.join()
    torch.testing.assert_close(got["out"], _expected(x, 3))
    assert not tl.core.is_builtin(tl.load)
