"""GemmaRMSNorm (vLLM ``GemmaRMSNorm``): Qwen3-Next's zero-centred RMSNorm, ``x / rms(x) * (1 + w)``.

Qwen3-Next runs it in the same shapes as the dense models' RMSNorm: the first layer's input norm
(plain), every other layer norm with the residual add fused in, and the full-attention layers'
per-head q/k norms over head_dim=256 (q after the gate is split off, so packed heads; k a strided
view of the fused qkv output). Trained weights sit near zero (the scale is ``1 + w``), so the task
draws them around zero: a candidate that scales by ``w`` alone is far off.
"""
from fk_pytest import standard_tests
from kernels_reference.L1.gemma_rms_norm import GemmaRMSNorm

from ..configs import load_config
from ..linear_inputs import GATED_DELTA_MODELS, zero_centred_norm_weights
from ..workload import model_dtype, token_cases
from .test_rms_norm import RMSNormTask


def _variants(cfg):
    """The captured GemmaRMSNorm calls of each variant (by the group's init and arguments): the layer
    norms of the model's width, without and with the residual; the per-head q and k norms."""
    wide = lambda g: g["init"]["hidden_size"] == cfg["hidden_size"]  # noqa: E731
    heads = lambda g, n: g["init"]["hidden_size"] == cfg["head_dim"] and g["args"]["x"]["shape"][1:2] == [n]  # noqa: E731
    return {"plain": lambda g: wide(g) and g["args"]["residual"] is None,
            "fused-add": lambda g: wide(g) and g["args"]["residual"] is not None,
            "q": lambda g: heads(g, cfg["num_attention_heads"]),
            "k": lambda g: heads(g, cfg["num_key_value_heads"])}


class GemmaRMSNormTask(RMSNormTask):
    name = "gemma_rms_norm"
    module_path = "L1/gemma_rms_norm.py"
    reference = GemmaRMSNorm

    def cases(self, profile):
        out = []
        for model in GATED_DELTA_MODELS:  # Qwen3-Next
            cfg, dt = load_config(model), model_dtype(model)
            hd, nq, nk = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
            for variant, calls in token_cases(model, profile, "GemmaRMSNorm", _variants(cfg)).items():
                for phase, t, weight, source in calls:
                    if variant in ("plain", "fused-add"):
                        out.append(self._case(model, phase, t, variant, dt, cfg["hidden_size"], cfg, weight, source))
                    elif variant == "q":  # the query half of each head's [q | gate] pair, reshaped to packed heads
                        q = self._qk_case(model, phase, t, "q", dt, cfg, weight, source)
                        q.params.update(hidden=hd, heads=nq, row_width=nq * hd, offset=0)
                        out.append(q)
                    else:  # k: a strided view into the fused [q | gate | k | v] projection
                        k = self._qk_case(model, phase, t, "k", dt, cfg, weight, source)
                        k.params.update(hidden=hd, heads=nk, row_width=(2 * nq + 2 * nk) * hd, offset=2 * nq * hd)
                        out.append(k)
        return out

    def init_weights(self, module, gen):
        zero_centred_norm_weights(module, gen)


TASK = GemmaRMSNormTask()
test_correctness, test_fuzz, test_speed = standard_tests(TASK)
