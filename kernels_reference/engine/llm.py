"""``LLM(model).generate(prompts, SamplingParams(...))`` over token ids.

Models: any ``kernels_reference.L4`` causal LM (``allocate_kv_cache``, ``forward``,
``compute_logits``). ``LLM.from_config`` builds one from an HF-style config with random weights
(or loads HF safetensors when paths are given).
"""
import contextlib
import dataclasses
from typing import List, Optional, Sequence as Seq, Union

import torch

from .block_manager import BlockManager
from .fused_decode import FusedDecodeConfig
from .runner import ModelRunner
from .scheduler import Scheduler
from .sequence import Sequence


def describe_batch(batch) -> str:
    """"decode, 3 sequences at context lengths 17, 20, 33" or a mixed / prefill step's shape."""
    decoding = [seq for seq, n in batch if seq.decodes(n)]
    chunks = [(seq.num_cached, n) for seq, n in batch if not seq.decodes(n)]
    kind = "decode" if not chunks else "prefill" if not decoding else "mixed"
    parts = [f"{kind}, {len(batch)} sequences, {sum(n for _, n in batch)} tokens"]
    if decoding:
        lens = [str(seq.num_cached) for seq in decoding[:8]]
        parts.append(f"decode context lengths {', '.join(lens)}{' ...' if len(decoding) > 8 else ''}")
    if chunks:
        shown = [f"{n} at {c}" for c, n in chunks[:8]]
        parts.append(f"prompt chunks (tokens at context) {', '.join(shown)}{' ...' if len(chunks) > 8 else ''}")
    return "; ".join(parts)


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

    def sample_batch(self, logits: torch.Tensor, params: Seq[SamplingParams]) -> List[int]:
        """One token per row. Greedy rows share one argmax and one device-to-host copy: a sync
        per row would cost more host time than a whole decode step at batch 64."""
        greedy = any(p.temperature <= 0 for p in params)
        out = logits.argmax(-1).tolist() if greedy else [0] * len(params)
        for i, p in enumerate(params):
            if p.temperature > 0:
                out[i] = self(logits[i], p)
        return out


class LLM:
    """Engine arguments beyond the scheduler's: ``max_model_len`` (longest prompt + output; the
    block-table width of the decode graphs; default: what the cache and the model's positions
    allow), ``cuda_graphs`` (capture pure-decode steps at ``graph_batch_sizes``, default 1, 2, 4, 8,
    16, 32, ... up to ``max_num_seqs``), ``padded_decode`` (the graphs' padded static-buffer path,
    run eagerly; on by default with graphs), ``compile`` (``torch.compile`` the model body; a dict
    gives ``torch.compile`` options), ``fused_decode`` (batch-1 decode steps of a Llama model built
    from the reference modules run with the per-layer glue fused into the GEMVs; a ``FusedDecodeConfig``
    says what to fuse: ``fused_decode.py``), ``scoring_chunk_tokens`` (the token budget of the steps
    :meth:`score` and :meth:`score_decode` schedule, where smaller than ``max_num_batched_tokens``:
    a scored prompt longer than it crosses chunk boundaries even where the serving budget would
    take it whole; :meth:`generate`, which is what gets timed, keeps the serving budget)."""

    def __init__(self, model, num_blocks: int = 256, block_size: int = 16, max_num_seqs: int = 64,
                 max_num_batched_tokens: int = 2048, chunked_prefill: bool = True,
                 max_model_len: Optional[int] = None, cuda_graphs: bool = False,
                 padded_decode: Optional[bool] = None, compile: Union[bool, dict] = False,
                 graph_batch_sizes: Optional[Seq[int]] = None, fused_decode: Union[bool, FusedDecodeConfig] = False,
                 scoring_chunk_tokens: Optional[int] = None):
        if scoring_chunk_tokens is not None and scoring_chunk_tokens < 1:
            raise ValueError(f"scoring_chunk_tokens must be a positive token count, got {scoring_chunk_tokens}")
        self.model = model.eval()
        # A state slot per admitted sequence (at most max_num_seqs run at once): the runner
        # allocates one more, the padded decode path's spare.
        slots = max_num_seqs if hasattr(model, "allocate_state_pools") else 0
        self.blocks = BlockManager(num_blocks, block_size, num_state_slots=slots)
        self.scheduler = Scheduler(self.blocks, max_num_seqs, max_num_batched_tokens, chunked_prefill)
        self.runner = ModelRunner(model, num_blocks, block_size, max_num_seqs, max_model_len,
                                  cuda_graphs, padded_decode, compile, graph_batch_sizes, fused_decode)
        self.max_model_len = self.runner.max_model_len
        self.sampler = Sampler(self.runner.device)  # replaceable, e.g. by a shape-only run's
        self._next_id = 0
        self.scoring_chunk_tokens = scoring_chunk_tokens

    @contextlib.contextmanager
    def _scoring_budget(self):
        """The scheduler's budget lowered to ``scoring_chunk_tokens`` while a score runs."""
        serving = self.scheduler.budget
        if self.scoring_chunk_tokens is not None:
            self.scheduler.budget = min(serving, self.scoring_chunk_tokens)
        try:
            yield
        finally:
            self.scheduler.budget = serving

    @staticmethod
    def from_config(config, dtype=torch.bfloat16, device="cpu", seed: int = 0,
                    safetensors: Optional[Seq[str]] = None, **engine_args) -> "LLM":
        from ..L4.llama import init_random_weights, model_for

        torch.manual_seed(seed)
        with torch.device(device):
            model = model_for(config)
        if safetensors:
            model.load_safetensors(safetensors)
        else:
            init_random_weights(model)
        return LLM(model.to(dtype), **engine_args)

    def generate(self, prompts: List[List[int]],
                 params: Union[SamplingParams, Seq[SamplingParams]] = SamplingParams()) -> List[List[int]]:
        """Output token ids per prompt; ``params`` is one for all prompts or one per prompt."""
        per_prompt = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(per_prompt) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(per_prompt)} SamplingParams")
        for prompt, p in zip(prompts, per_prompt):  # all checked before any is queued
            if not prompt:
                raise ValueError("empty prompt")
            self._check_length(len(prompt) + p.max_tokens, "prompt + max_tokens")
        seqs = [self._add(prompt, p.max_tokens, p) for prompt, p in zip(prompts, per_prompt)]
        self.sampler.reset()
        self._serve(lambda ready, rows: self._sample(rows, [seq.params for seq in ready]))
        return [s.output_ids for s in seqs]

    def score_decode(self, sequences: List[List[int]], prompt_lens: List[int]) -> List[List[int]]:
        """Decode-forced scoring: per sequence, the prompt is prefilled and every following given
        token is fed back as one decode step, exactly as :meth:`generate` would feed its own
        samples (the same scheduler: mixed prefill + decode batches, preemption, the padded and
        CUDA-graph decode path). Returns the greedy top-1 prediction of each given output token,
        the first from the prompt's last chunk and the rest from decode steps. Scoring the model's
        own greedy output this way replays its :meth:`generate` run token for token."""
        self._check_scored(sequences, prompt_lens)
        seqs, targets, preds = [], {}, {}
        for tokens, prompt_len in zip(sequences, prompt_lens):
            if prompt_len == len(tokens):
                seqs.append(None)
                continue
            seq = self._add(tokens[:prompt_len], len(tokens) - prompt_len, None)
            targets[seq.seq_id], preds[seq.seq_id] = list(tokens), {}
            seqs.append(seq)

        def forced(ready, rows):
            predicted = rows.argmax(-1).tolist()
            for seq, token in zip(ready, predicted):
                # Keyed by the position predicted: a preempted sequence's recomputation overwrites.
                preds[seq.seq_id][len(seq.token_ids)] = int(token)
            return [targets[seq.seq_id][len(seq.token_ids)] for seq in ready]

        with self._scoring_budget():
            self._serve(forced)
        return [[] if s is None else [preds[s.seq_id][p] for p in range(s.prompt_len, len(targets[s.seq_id]))]
                for s in seqs]

    def _serve(self, next_tokens) -> None:
        """Run the queued sequences to their ``max_tokens``. After each step, ``next_tokens(ready,
        logits)`` gets the sequences whose inputs are all cached (their last-token logits rows) and
        returns the token each appends: a sample (generate) or the given one (decode-forced)."""
        step = 0
        while self.scheduler.has_work():
            batch = self.scheduler.schedule()
            step += 1
            try:
                logits = self.runner.run(batch)
            except Exception as exc:  # the step and batch shape say where a model broke
                exc.add_note(f"in engine step {step}: {describe_batch(batch)}")
                raise
            ready = [i for i, (seq, _) in enumerate(batch) if seq.num_cached == len(seq.token_ids)]
            if not ready:  # only prompt chunks: nothing to sample yet
                continue
            rows = logits if len(ready) == len(batch) else logits[ready]
            ready_seqs = [batch[i][0] for i in ready]
            for seq, token in zip(ready_seqs, next_tokens(ready_seqs, rows)):
                seq.token_ids.append(token)
                if seq.num_generated >= seq.max_tokens:
                    self.scheduler.finish(seq)

    def score(self, sequences: List[List[int]], prompt_lens: List[int]) -> List[List[int]]:
        """Teacher forcing: per sequence, the greedy top-1 token the model predicts at every
        position from ``prompt_len - 1`` to ``len - 2`` (its guess of each given output token),
        through the engine's own path (paged cache, chunked prefill, preemption)."""
        self._check_scored(sequences, prompt_lens)
        first, preds, seqs = {}, {}, []
        for tokens, prompt_len in zip(sequences, prompt_lens):
            if prompt_len == len(tokens):  # no output token to predict
                seqs.append(None)
                continue
            # The last token is never an input: what follows it is not being scored.
            seq = self._add(tokens[:-1], 0, None)
            first[seq.seq_id], preds[seq.seq_id] = prompt_len - 1, {}
            seqs.append(seq)
        with self._scoring_budget():
            while self.scheduler.has_work():
                batch = self.scheduler.schedule()
                starts = [seq.num_cached for seq, _ in batch]
                predicted = self.runner.predict_tokens(batch, [first[seq.seq_id] for seq, _ in batch])
                for (seq, n), start, tokens in zip(batch, starts, predicted):
                    # Positions are keyed, so a preempted sequence's recomputation just overwrites.
                    preds[seq.seq_id].update(zip(range(start + n - len(tokens), start + n), tokens))
                    if seq.num_cached == len(seq.token_ids):
                        self.scheduler.finish(seq)
        return [[] if s is None else [preds[s.seq_id][p] for p in range(first[s.seq_id], len(s.token_ids))]
                for s in seqs]

    def _check_scored(self, sequences, prompt_lens) -> None:
        if len(sequences) != len(prompt_lens):
            raise ValueError(f"{len(sequences)} sequences but {len(prompt_lens)} prompt lengths")
        for tokens, prompt_len in zip(sequences, prompt_lens):  # all checked before any is queued
            if not 1 <= prompt_len <= len(tokens):
                raise ValueError(f"prompt_len {prompt_len} outside 1..{len(tokens)} (sequence length)")
            self._check_length(len(tokens), "sequence")

    def _add(self, tokens: List[int], max_tokens: int, params) -> Sequence:
        seq = Sequence(self._next_id, list(tokens), len(tokens), max_tokens, params)
        self._next_id += 1
        self.scheduler.add(seq)
        return seq

    def _check_length(self, n: int, what: str) -> None:
        if n > self.max_model_len:
            raise ValueError(f"{what} = {n} tokens exceeds max_model_len={self.max_model_len}")

    def _sample(self, logits: torch.Tensor, params: List[SamplingParams]) -> List[int]:
        batched = getattr(self.sampler, "sample_batch", None)  # a replacement may be per-row only
        if batched is not None:
            return batched(logits, params)
        return [self.sampler(row, p) for row, p in zip(logits, params)]
