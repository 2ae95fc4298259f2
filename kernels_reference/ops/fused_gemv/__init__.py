"""The fused decode GEMVs of the engine's batch-1 fused decode (gemv.py).
"""
