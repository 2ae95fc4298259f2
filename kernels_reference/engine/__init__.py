"""A compact production-style engine over the reference models: paged KV cache with a block
manager, continuous batching with chunked prefill, CUDA-graph decode at bucketed batch sizes,
optional ``torch.compile`` of the model body, greedy and temperature sampling, an
``LLM(...).generate(...)`` API taking prompts as token ids, and ``LLM.score`` (teacher-forced
greedy predictions) for end-to-end comparisons; at batch 1 an optional fused decode step
(``fused_decode``) for models built from the reference Llama modules."""
from .fused_decode import FusedDecodeConfig
from .llm import LLM, SamplingParams

__all__ = ["LLM", "SamplingParams", "FusedDecodeConfig"]
