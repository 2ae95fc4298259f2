"""Composite modules run their children's fast paths in ``forward`` and their children's
``forward_native`` in ``forward_native``, so a float64 ``forward_native`` of a whole model is pure
PyTorch all the way down (the ground truth of the correctness checks)."""


def run(module, native: bool, *args, **kwargs):
    return module.forward_native(*args, **kwargs) if native else module(*args, **kwargs)
