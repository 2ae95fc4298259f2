"""Workload pieces shared by the task modules: which models, token counts and value distributions.

Token counts until captured workloads exist (a later issue): decode batches from 1 to 256 and
prefill chunks up to 8192 (16384 for the bandwidth regime) on the GPU; a few small real shapes on
the CPU, where Triton kernels run interpreted. All cases weigh 1 until captures provide counts.
"""
from typing import Iterator, Tuple

import torch

from .configs import load_config

LLAMA_FAMILY = ("llama-3.1-8b", "qwen3-8b", "mistral-7b-v0.3", "qwen2.5-7b")
TOKENS = {
    "cpu": {"decode": (1, 7), "prefill": (65,)},
    "full": {"decode": (1, 32, 128, 256), "prefill": (1024, 8192, 16384)},
}
# Other dtypes are swept on one model at a few sizes (the models themselves run bf16).
DTYPE_SWEEP = {"cpu": ("llama-3.1-8b", (7,)), "full": ("llama-3.1-8b", (32, 8192))}
# Under the CPU profile the interpreter runs every Triton program in numpy: cap a case's size.
CPU_MAX_ELEMENTS = 1 << 18


def phases(profile: str, max_tokens: int = 1 << 30) -> Iterator[Tuple[str, int]]:
    for phase, counts in TOKENS[profile].items():
        for t in counts:
            if t <= max_tokens:
                yield phase, t


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
