"""Serving scenarios: request mixes the engine runs to produce realistic kernel workloads.

Each scenario is a set of requests (prompt token ids, number of output tokens) that all arrive at
once, plus the engine arguments of a production server. Token ids are synthetic (uniform below the
vocabulary): the kernels' shapes depend on lengths only, never on which tokens they are.

Published statistics used:

* Chat: the Azure LLM inference trace (2023, "conversation" service) that Splitwise characterises
  (Patel et al., "Splitwise: Efficient Generative LLM Inference Using Phase Splitting", ISCA 2024;
  trace published as AzurePublicDataset ``AzureLLMInferenceTrace_conv``): median prompt about
  1020 tokens, median output about 129 tokens. These medians are quoted from the paper as cited in
  the task brief; they could not be re-checked against the paper text here. The paper gives medians,
  not a spread: the log-normal shape and its sigmas below are our assumption (a heavy right tail,
  as request-length distributions have), clipped to the served context.
* Engine arguments: vLLM V1's defaults for an OpenAI-compatible server on a GPU with >= 70 GiB
  (H100/H200 class): ``max_num_batched_tokens=8192``, ``max_num_seqs=1024``
  (``EngineArgs.get_batch_defaults`` in ``vllm/engine/arg_utils.py``), chunked prefill on, KV-cache
  block size 16.
* Long context: Llama-3.1 serves a 128k-token context; four 32000-token prompts with short outputs
  (retrieval / document QA) are a long-context load that one H200 holds, and that still fits the
  32768-position models (Qwen2.5, Mistral) with the output.
* Long prefill (the state models: Mamba-2, Qwen3-Next): two 65536-token prompts, a context length
  where a per-sequence state of constant size, not a cache that grows, is what the model is for.
"""
from __future__ import annotations

import dataclasses
import math
import random
from typing import Any, Dict, List, Tuple

VLLM_SERVER_ENGINE_ARGS = {"max_num_seqs": 1024, "max_num_batched_tokens": 8192, "block_size": 16,
                           "chunked_prefill": True}


@dataclasses.dataclass(frozen=True)
class LengthDistribution:
    """Lengths drawn log-normally around ``median`` (``sigma`` 0: always the median), clipped."""

    median: int
    sigma: float = 0.0
    low: int = 1
    high: int = 1 << 20

    def draw(self, rng: random.Random, scale: float) -> int:
        value = self.median * (math.exp(rng.gauss(0.0, self.sigma)) if self.sigma > 0 else 1.0)
        return max(1, int(round(min(max(value, self.low), self.high) * scale)))


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str  # "chat", "long-context", "batch-1", "batch-32", "long-prefill"
    description: str  # incl. the published statistics and their source
    engine_args: Dict[str, Any]  # LLM(...) kwargs: max_num_seqs, max_num_batched_tokens, block_size
    num_requests: int = 1
    prompt: LengthDistribution = LengthDistribution(1024)
    output: LengthDistribution = LengthDistribution(128)

    def requests(self, vocab_size: int, seed: int = 0, scale: float = 1.0) -> List[Tuple[List[int], int]]:
        """(prompt token ids, output tokens) per request; scale < 1 shrinks lengths and counts (CPU)."""
        if not 0 < scale <= 1:
            raise ValueError(f"scale must be in (0, 1], got {scale}")
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be positive, got {vocab_size}")
        # Two streams: the lengths must not depend on the vocabulary the ids are drawn from.
        lengths, ids = random.Random(f"{self.name}-{seed}-lengths"), random.Random(f"{self.name}-{seed}-ids")
        count = max(1, int(round(self.num_requests * scale)))
        out = []
        for _ in range(count):
            n_prompt, n_out = self.prompt.draw(lengths, scale), self.output.draw(lengths, scale)
            out.append(([ids.randrange(vocab_size) for _ in range(n_prompt)], n_out))
        return out

    def num_blocks(self, block_size: int, scale: float = 1.0) -> int:
        """Enough KV blocks to hold every request whole at once (no preemption changes the steps)."""
        # Lengths only: the ids do not matter, so draw against a one-token vocabulary.
        reqs = self.requests(1, scale=scale)
        return sum(-(-(len(p) + n) // block_size) for p, n in reqs) + 1


SCENARIOS: Dict[str, Scenario] = {s.name: s for s in (
    Scenario(
        "chat",
        "Chat serving: 256 requests arriving together, prompt and output lengths log-normal around the "
        "medians of the Azure LLM inference trace 2023 (conversation) reported by Splitwise (Patel et "
        "al., ISCA 2024): prompt median 1020 tokens (sigma 1.0 assumed, clipped to 16..16384), output "
        "median 129 tokens (sigma 0.9 assumed, clipped to 1..2048). Medians quoted, not re-verified "
        "here. vLLM V1 server defaults (H100/H200 class): 8192 batched tokens, 1024 sequences, block 16.",
        dict(VLLM_SERVER_ENGINE_ARGS), num_requests=256,
        prompt=LengthDistribution(1020, 1.0, 16, 16384), output=LengthDistribution(129, 0.9, 1, 2048)),
    Scenario(
        "long-context",
        "Long context: 4 prompts of 32000 tokens (Llama-3.1 serves 128k; 32000 + 128 still fits the "
        "32768-position models) with 128-token outputs, as document QA / retrieval does; prefill runs "
        "in 8192-token chunks that read earlier chunks from the cache. vLLM V1 server defaults.",
        dict(VLLM_SERVER_ENGINE_ARGS), num_requests=4,
        prompt=LengthDistribution(32000), output=LengthDistribution(128)),
    Scenario(
        "batch-1",
        "Batch 1 (latency): one request, a 1024-token prompt and 512 output tokens. vLLM V1 server "
        "defaults.",
        dict(VLLM_SERVER_ENGINE_ARGS), num_requests=1,
        prompt=LengthDistribution(1024), output=LengthDistribution(512)),
    Scenario(
        "batch-32",
        "Fixed batch of 32: 32 identical-length requests, 1024-token prompts and 512 output tokens. vLLM "
        "V1 server defaults.",
        dict(VLLM_SERVER_ENGINE_ARGS), num_requests=32,
        prompt=LengthDistribution(1024), output=LengthDistribution(512)),
    Scenario(
        "long-prefill",
        "Long prefill: 2 prompts of 65536 tokens with 128-token outputs (a whole document or code base "
        "read once), the load a linear-attention or state-space model is served for: its state per "
        "sequence stays one size however long the context, where attention's cache and cost grow with "
        "it. Prefill runs in 8192-token chunks, each carrying its sequences' states to the next. vLLM "
        "V1 server defaults.",
        dict(VLLM_SERVER_ENGINE_ARGS), num_requests=2,
        prompt=LengthDistribution(65536), output=LengthDistribution(128)),
)}
