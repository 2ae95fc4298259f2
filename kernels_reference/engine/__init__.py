"""A compact production-style engine over the reference models: paged KV cache with a block
manager, continuous batching with chunked prefill, greedy and temperature sampling, and an
``LLM(...).generate(...)`` API taking prompts as token ids."""
from .llm import LLM, SamplingParams

__all__ = ["LLM", "SamplingParams"]
