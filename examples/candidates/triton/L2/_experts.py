"""The routed experts this tree's MoE blocks use: this tree's own ``L1/fused_moe.py`` once it has
one, the reference FusedMoE until then (the tree has no MoE kernel yet; the blocks above it are
this tree's own code either way)."""
try:
    from ..L1.fused_moe import FusedMoE  # noqa: F401
except ImportError:
    from kernels_reference.L1.fused_moe import FusedMoE  # noqa: F401
