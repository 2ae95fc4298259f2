"""Workload pieces shared by the task modules: which models, token counts and value distributions.

Token counts. The full (GPU) profile takes them from the captured serving workloads
(``tasks/workloads``, see its loader): per model, ``CAPTURED_TOKEN_COUNTS`` representative token
counts with the captured call shares as case weights. Hand-picked shapes remain where no capture
applies: models without a capture (weights 1/len so every model counts the same), the bandwidth
regime (``BANDWIDTH_TOKENS``: the captures' steps stop at the 8192-token budget) and the dtype sweep,
both weighted ``HAND_PICKED_WEIGHT`` so they are scored and timed but barely move a task's speedup.
The CPU profile keeps a few small hand-picked shapes (Triton kernels run interpreted there).
"""
import math
import weakref
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import torch

from .configs import load_config
from .workloads import load_capture, token_histogram, token_representatives

LLAMA_FAMILY = ("llama-3.1-8b", "qwen3-8b", "mistral-7b-v0.3", "qwen2.5-7b")
TOKENS = {
    "cpu": {"decode": (1, 7), "prefill": (65,)},
    "full": {"decode": (1, 32, 128, 256), "prefill": (1024, 8192, 16384)},
}
CAPTURED_TOKEN_COUNTS = 8  # representatives per model and task from a capture
BANDWIDTH_TOKENS = (16384,)  # hand-picked: the bandwidth regime no captured step reaches
HAND_PICKED_WEIGHT = 0.01  # > 0: a run that selects only hand-picked cases still has a geomean
# Other dtypes are swept on one model at a few sizes (the models themselves run bf16).
DTYPE_SWEEP = {"cpu": ("llama-3.1-8b", (7,)), "full": ("llama-3.1-8b", (32, 8192))}
# Under the CPU profile the interpreter runs every Triton program in numpy: cap a case's size.
CPU_MAX_ELEMENTS = 1 << 18


def phases(profile: str, max_tokens: int = 1 << 30) -> Iterator[Tuple[str, int]]:
    for phase, counts in TOKENS[profile].items():
        for t in counts:
            if t <= max_tokens:
                yield phase, t


def token_cases(model: str, profile: str, cls: str, variants: Optional[Dict[str, Callable[[dict], bool]]] = None,
                max_tokens: int = 1 << 30) -> Dict[str, List[Tuple[str, int, float, str]]]:
    """Per variant, the (phase, tokens, weight, source) cases of one model for a task on class ``cls``.

    ``variants`` maps a variant name to a select on the capture's call groups of ``cls`` (e.g. plain
    and fused-add RMSNorm); default: one variant ``""`` with every call. Under the full profile with
    a capture, the variants share representative token counts (chosen over all their calls) and each
    gets its own folded call shares; a variant without calls gets no cases. Otherwise hand-picked.
    """
    variants = variants or {"": lambda g: True}
    if profile == "cpu" or load_capture(model) is None:
        hand = list(phases(profile, max_tokens))
        weight = 1.0 if profile == "cpu" else 1.0 / (len(hand) * len(variants))  # 1 per model
        return {v: [(phase, t, weight, "hand-picked") for phase, t in hand] for v in variants}
    chosen = lambda g: any(select(g) for select in variants.values())  # noqa: E731
    reps = [r for r in token_representatives(token_histogram(model, cls, chosen), CAPTURED_TOKEN_COUNTS)
            if r[1] <= max_tokens]
    counts = [n for _, n, _ in reps]
    out = {}
    for name, select in variants.items():
        weights = fold_tokens(token_histogram(model, cls, select), counts)
        if not any(weights):
            out[name] = []
            continue
        out[name] = [(phase, n, w, "captured") for (phase, n, _), w in zip(reps, weights) if w > 0]
        out[name] += [("prefill", t, HAND_PICKED_WEIGHT, "hand-picked") for t in BANDWIDTH_TOKENS
                      if t <= max_tokens and t not in counts]
    return out


def fold_tokens(hist, counts) -> List[float]:
    """Weights of ``hist`` (phase, n) -> w folded onto the nearest of ``counts`` (in log2 n)."""
    out = [0.0] * len(counts)
    for (_, n), w in hist.items():
        out[min(range(len(counts)), key=lambda i: (abs(math.log2(n) - math.log2(counts[i])), i))] += w
    return out


def model_dtype(model: str) -> torch.dtype:
    return getattr(torch, load_config(model).get("torch_dtype", "bfloat16"))


def activations(shape, gen: torch.Generator, device, dtype, scale: float = 1.0) -> torch.Tensor:
    """Hidden-state-like values: normal, with a few outlier channels as real LLM activations have."""
    x = torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * scale
    n_outliers = max(1, shape[-1] // 512)
    channels = torch.randint(0, shape[-1], (n_outliers,), generator=gen, device=device)
    x[..., channels] *= 8.0
    return x.to(dtype)


def fuzz_cap(tokens: int, width: int, profile: str) -> int:
    """Shrink a fuzzed token count so one CPU case stays small enough for the interpreter."""
    if profile != "cpu":
        return tokens
    return max(1, min(tokens, CPU_MAX_ELEMENTS // max(width, 1)))


_PLANNERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # module -> its plan_step methods


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def call_with_metadata(module, inputs: Dict, method: Optional[str] = None, exclude=()):
    """``module`` (or its ``method``) on ``inputs`` with ``inputs["metadata"]`` as the forward
    context, as the model runner sets it for a step; ``exclude``: other inputs that are not
    arguments (KV caches bound to the layers).

    Modules that plan per step (``plan_step``, see :mod:`kernels_reference.forward_context`) plan on
    the metadata first, as the engine has them do before each step, except inside graph capture
    (the plan of the warm-up call before it stands, as before a replay). A plan's time is not in a
    kernel-level time, as the per-step metadata work of the reference is not; it is in every
    end-to-end time.
    """
    from kernels_reference.forward_context import plan_step, set_forward_context, step_planners
    meta = inputs["metadata"]
    if not _capturing():
        planners = _PLANNERS.get(module)
        if planners is None:
            planners = _PLANNERS.setdefault(module, step_planners(module))
        plan_step(planners, meta)
    args = {k: v for k, v in inputs.items() if k != "metadata" and k not in exclude}
    with set_forward_context(meta):
        return (getattr(module, method) if method else module)(**args)
