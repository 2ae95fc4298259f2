"""Production-grade reference modules for FastKernels.

Levels: ``L1`` primitives, ``L2`` fused modules, ``L3`` layers, ``L4`` models. Every module has
``forward_native`` (pure PyTorch, the semantic definition) and a fast GPU path; ``forward``
dispatches between them (see :mod:`kernels_reference.dispatch`).
"""
