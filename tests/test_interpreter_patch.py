"""The interpreter's nested-call re-patching skipped (fk_pytest.interpreter): the same results, and
a patch count that no longer grows with the nested calls a launch makes."""
import os
from unittest import mock

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

from fk_pytest.interpreter import skip_nested_repatching  # noqa: E402

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


def _unpatched():
    """Triton's own interpreter for the duration: the original launch and patch functions."""
    return [mock.patch.object(interpreter, "_patch_lang", interpreter._patch_lang.__wrapped__),
            mock.patch.object(interpreter.GridExecutor, "__call__", interpreter.GridExecutor.__call__.__wrapped__)]


def test_nested_calls_no_longer_repatch_and_results_are_unchanged():
    assert skip_nested_repatching()  # the plugin installed it on the CPU; a second call keeps it
    x = torch.randn(3, 13)
    _run(x, 1)  # a first launch leaves triton.language.standard's globals as every later one sees them
    # With the skip: the launch's patch and one for the modules tl.sum and tl.max see, however many
    # nested calls the launch makes.
    assert _patches_of_one_launch(x, 2) == _patches_of_one_launch(x, 8)
    got = _run(x, 8)
    torch.testing.assert_close(got, _expected(x, 8))
    patches = _unpatched()
    for p in patches:
        p.start()
    try:
        # Triton's own: a patch per nested call, and bit for bit the same output.
        assert _patches_of_one_launch(x, 8) > _patches_of_one_launch(x, 2)
        assert torch.equal(_run(x, 8), got)
    finally:
        for p in reversed(patches):
            p.stop()


def test_the_language_is_restored_after_a_launch():
    _run(torch.randn(2, 5), 2)
    # The launch patched triton.language's builtins and put them back at its end.
    assert tl.core.is_builtin(tl.load) and tl.core.is_builtin(tl.program_id)


def test_a_launch_from_another_thread_computes_the_same():
    """The skip's bookkeeping is per thread: a kernel launched from a worker thread (as a
    candidate's background work may) patches and restores as in the main thread."""
    import threading

    x = torch.randn(4, 9)
    got = {}
    worker = threading.Thread(target=lambda: got.setdefault("out", _run(x, 3)))
    worker.start()
    worker.join()
    torch.testing.assert_close(got["out"], _expected(x, 3))
    assert tl.core.is_builtin(tl.load)
