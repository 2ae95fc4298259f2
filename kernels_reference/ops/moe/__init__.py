"""The Triton kernels of ``L1/fused_moe.py`` (kernels.py): block alignment, grouped GEMM, slot sum,
and the small-batch GEMVs.
"""
