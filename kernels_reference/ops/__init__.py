"""The reference kernels, one package per op (Triton, CUDA and native forms side by side).

The modules with production interfaces (``kernels_reference/L1``..``L4``) import these; an op never
imports a module level (tests/test_layout.py checks it).
"""
