"""Built-in bugs of the reference stack, run inside every end-to-end case.

An end-to-end case only counts when it can see bugs that a kernel-level task catches: each mutant
below is the reference with one realistic kernel mistake, composed into the model exactly as a
candidate would be (same weights, same engine path). A case in which a mutant still earns credit
is INSENSITIVE (see :mod:`fk_pytest.e2e`). Each mutant runs the reference's own code path (fast
path on CUDA, native on the CPU) apart from its one mistake.
"""
import torch

from kernels_reference.L1.deepseek_rotary_emb import DeepseekScalingRotaryEmbedding
from kernels_reference.L1.rms_norm import RMSNorm
from kernels_reference.L1.rotary_emb import RotaryEmbedding
from kernels_reference.L1.silu_and_mul import SiluAndMul
from kernels_reference.L1.topk_softmax import TopKSoftmax


class RopeIgnoresPositions(RotaryEmbedding):
    """Rotates every token as if it sat at position 0 (i.e. not at all): no position information."""

    def forward(self, positions, query, key):
        return super().forward(torch.zeros_like(positions), query, key)


class DeepseekRopeIgnoresPositions(DeepseekScalingRotaryEmbedding):
    """DeepSeek's YaRN RoPE with the same mistake: every token rotated as if at position 0."""

    def forward(self, positions, query, key):
        return super().forward(torch.zeros_like(positions), query, key)


class RmsNormReturnsOldResidual(RMSNorm):
    """Fused add + RMSNorm that normalises x + residual but hands back the residual it was given,
    so the residual stream never accumulates the layers' outputs."""

    def forward(self, x, residual=None):
        if residual is None:
            return super().forward(x)
        out, _ = super().forward(x, residual.clone())  # the fast path may update its inputs in place
        return out, residual


class SiluAndMulHalvesSwapped(SiluAndMul):
    """silu(up) * gate instead of silu(gate) * up: the two halves of gate_up read the wrong way."""

    def forward(self, x):
        d = x.shape[-1] // 2
        return super().forward(torch.cat([x[..., d:], x[..., :d]], dim=-1))


class TopKExpertOffByOne(TopKSoftmax):
    """Picks the right experts and weights but reports each id one too high (mod E): an
    off-by-one between the router's expert numbering and the expert weights' order."""

    def forward(self, gating_output):
        weights, ids = super().forward(gating_output)
        return weights, ((ids + 1) % gating_output.shape[-1]).to(ids.dtype)


BUILTIN_MUTANTS = {
    "rope-ignores-positions": {RotaryEmbedding: RopeIgnoresPositions,
                               DeepseekScalingRotaryEmbedding: DeepseekRopeIgnoresPositions},
    "rms-norm-old-residual": {RMSNorm: RmsNormReturnsOldResidual},
    "silu-and-mul-halves-swapped": {SiluAndMul: SiluAndMulHalvesSwapped},
    # Mixture-of-experts models only (a model without the class records "no module to replace").
    "topk-expert-off-by-one": {TopKSoftmax: TopKExpertOffByOne},
}
