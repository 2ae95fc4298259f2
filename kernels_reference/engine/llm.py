"""``LLM(model).generate(prompts, SamplingParams(...))`` over token ids.

Models: any ``kernels_reference.L4`` causal LM (``allocate_kv_cache``, ``forward``,
``compute_logits``). ``LLM.from_config`` builds one from an HF-style config with random weights
(or loads HF safetensors when paths are given).
"""
import dataclasses
from typing import List, Optional, Sequence as Seq, Union

import torch

from .block_manager import BlockManager
from .runner import ModelRunner
from .scheduler import Scheduler
from .sequence import Sequence


@dataclasses.dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0  # 0: greedy
    seed: Optional[int] = None


class Sampler:
    """Greedy (temperature 0) or seeded temperature sampling of one row of logits."""

    def __init__(self, device):
        self.device = device
        self.generators = {}

    def reset(self) -> None:
        self.generators.clear()

    def __call__(self, logits: torch.Tensor, params: SamplingParams) -> int:
        if params.temperature <= 0:
            return int(logits.argmax())
        key = id(params)
        if key not in self.generators:  # one stream per request's params: reproducible per seed
            gen = torch.Generator(device=self.device)
            if params.seed is not None:
                gen.manual_seed(params.seed)
            self.generators[key] = gen
        probs = torch.softmax(logits / params.temperature, dim=-1)
        return int(torch.multinomial(probs, 1, generator=self.generators[key]))


class LLM:
    def __init__(self, model, num_blocks: int = 256, block_size: int = 16, max_num_seqs: int = 64,
                 max_num_batched_tokens: int = 2048, chunked_prefill: bool = True):
        self.model = model.eval()
        self.blocks = BlockManager(num_blocks, block_size)
        self.scheduler = Scheduler(self.blocks, max_num_seqs, max_num_batched_tokens, chunked_prefill)
        self.runner = ModelRunner(model, num_blocks, block_size)
        self.sampler = Sampler(self.runner.device)  # replaceable, e.g. by a shape-only run's
        self._next_id = 0

    @staticmethod
    def from_config(config, dtype=torch.bfloat16, device="cpu", seed: int = 0,
                    safetensors: Optional[Seq[str]] = None, **engine_args) -> "LLM":
        from ..L4.llama import model_for

        torch.manual_seed(seed)
        with torch.device(device):
            model = model_for(config)
        if safetensors:
            model.load_safetensors(safetensors)
        else:
            with torch.no_grad():  # random weights at a trained scale
                for p in model.parameters():
                    p.copy_(torch.randn_like(p) * p.shape[1] ** -0.5 if p.dim() == 2 else 1 + 0.1 * torch.randn_like(p))
        return LLM(model.to(dtype), **engine_args)

    def generate(self, prompts: List[List[int]],
                 params: Union[SamplingParams, Seq[SamplingParams]] = SamplingParams()) -> List[List[int]]:
        """Output token ids per prompt; ``params`` is one for all prompts or one per prompt."""
        per_prompt = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(per_prompt) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(per_prompt)} SamplingParams")
        seqs = []
        for prompt, p in zip(prompts, per_prompt):
            if not prompt:
                raise ValueError("empty prompt")
            seq = Sequence(self._next_id, list(prompt), len(prompt), p.max_tokens, p)
            self._next_id += 1
            seqs.append(seq)
            self.scheduler.add(seq)
        self.sampler.reset()
        while self.scheduler.has_work():
            batch = self.scheduler.schedule()
            logits = self.runner.run(batch)
            for (seq, _), row in zip(batch, logits):
                if seq.num_cached < len(seq.token_ids):  # a prompt chunk: nothing to sample yet
                    continue
                seq.token_ids.append(self.sampler(row, seq.params))
                if seq.num_generated >= seq.max_tokens:
                    self.scheduler.finish(seq)
        return [s.output_ids for s in seqs]
