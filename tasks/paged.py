"""Shared shape of the tasks that attend over a paged KV cache (L1 attention, L2 attention block,
L3 decoder layer, L4 model): batch mixes, metadata in the forward context, caches as inputs.

A case is a batch of sequences, each with ``context`` tokens already in the cache and ``query``
new tokens this step (decode: 1). Caches are inputs named ``k_cache_<i>``/``v_cache_<i>`` (one
pair per attention layer) so that every run gets its own copy; their state after the call is an
output (the layer must store the step's keys/values at the slot mapping). Blocks are handed out in
a shuffled order, as a block manager does after some churn.
"""
import dataclasses
from typing import Dict, List, Tuple

import torch

from fk_pytest import Case, Task
from fk_pytest.task import DTYPE_NAMES, RanksDisagree, at_degree
from kernels_reference.forward_context import AttentionMetadata
from kernels_reference.model_config import LlamaArchConfig

from .configs import head_dim, load_config
from .workload import HAND_PICKED_WEIGHT, activations, call_with_metadata, model_dtype
from .workloads import batch_name, batch_representatives, load_capture

BLOCK_SIZE = 16
CAPTURED_BATCHES = 8  # representative attention steps per model from its capture (full profile)
# The paged-decode bandwidth targets' shapes (one long sequence; a batch at moderate context), kept
# beside the captured steps at a token weight, as the 16384-token bandwidth shapes are.
TARGET_BATCHES = ("decode-B1-C8192", "decode-B32-C2048")
# Hand-picked: name -> (context lens, query lens) per profile; decode contexts vary within the batch.
# The CPU profile and models without a capture use these (the L4 task picks from the full ones).
BATCHES = {
    "cpu": {"decode-B3": ([40, 17, 63], [1, 1, 1]), "prefill-B2-chunked": ([0, 21], [9, 6])},
    "full": {"decode-B1-C8192": ([8191], [1]),
             "decode-B32-C2048": ([1024 + (37 * i) % 1024 for i in range(32)], [1] * 32),
             "decode-B128-C1024": ([512 + (53 * i) % 512 for i in range(128)], [1] * 128),
             "prefill-B1-Q2048": ([0], [2048]),
             "prefill-B4-varlen": ([0, 0, 0, 0], [700, 129, 1024, 33]),
             "prefill-chunk-Q1024-C3072": ([3072], [1024])},
}


def arch_config(model: str, layers: int = 1, vocab_shard: int = 1) -> LlamaArchConfig:
    cfg = dict(load_config(model))
    cfg["num_hidden_layers"] = layers
    cfg["vocab_size"] = cfg["vocab_size"] // vocab_shard
    return LlamaArchConfig.from_hf(cfg)


class PagedTask(Task):
    family = "attention"
    layers = 1  # attention layers (cache pairs) in the module
    models = {"cpu": ("qwen3-0.6b", "qwen2.5-0.5b"), "full": ("llama-3.1-8b", "qwen3-8b", "mistral-7b-v0.3", "qwen2.5-7b")}

    def batch_cases(self, profile, params_for) -> List[Case]:
        out = []
        for model in self.models[profile]:
            dt = model_dtype(model)
            for name, (ctx, q) in BATCHES[profile].items():
                params = dict(params_for(model), context=ctx, query=q, model=model)
                out.append(Case(f"{model}-{name}-{DTYPE_NAMES[dt]}", dt, model=model, params=params))
        return out

    def captured_batch_cases(self, profile, params_for) -> List[Case]:
        """Batches from the model's captured serving steps (full profile), with their step shares as
        weights (summing to 1 per model); hand-picked ``BATCHES`` where no capture applies."""
        if profile == "cpu":
            return self.batch_cases(profile, params_for)
        out = []
        for model in self.models[profile]:
            if load_capture(model) is None:
                hand = [c for c in self.batch_cases(profile, params_for) if c.model == model]
                out += [dataclasses.replace(c, weight=1.0 / len(hand)) for c in hand]
                continue
            dt = model_dtype(model)
            for phase, ctx, q, weight in batch_representatives(model, CAPTURED_BATCHES):
                params = dict(params_for(model), context=list(ctx), query=list(q), model=model, source="captured")
                out.append(Case(f"{model}-{batch_name(phase, ctx, q)}-{DTYPE_NAMES[dt]}", dt, model=model,
                                params=params, weight=weight))
            out += [dataclasses.replace(c, weight=HAND_PICKED_WEIGHT)
                    for c in self.batch_cases(profile, params_for)
                    if c.model == model and any(f"-{name}-" in c.id for name in TARGET_BATCHES)]
        return out

    # ---- tensor parallelism (fk_pytest.tp_eval) --------------------------------------------------
    tp_degrees: Tuple[int, ...] = ()  # degrees the CPU profile also scores the first decode batch at

    def with_tp_cases(self, cases: List[Case], profile: str) -> List[Case]:
        """``cases`` and, on the CPU profile, the first decode batch whose model's heads every degree
        of ``tp_degrees`` shards (query heads divided; KV heads divided, or replicated when the
        degree is a multiple of them) again at each degree (``tp`` param)."""
        if profile != "cpu" or not self.tp_degrees:
            return cases
        for base in (c for c in cases if "-decode-" in c.id):
            nq, nk, _ = self.heads(base)
            if all(nq % tp == 0 and (nk % tp == 0 or tp % nk == 0) for tp in self.tp_degrees):
                return cases + [at_degree(base, tp) for tp in self.tp_degrees]
        return cases

    def rank_kv_heads(self, case, rank: int, tp: int) -> slice:
        """The KV heads rank ``rank`` holds, as QKVParallelLinear shards them: nk / tp of them, or
        the one it shares with tp / nk - 1 other ranks."""
        _, nk, _ = self.heads(case)
        if tp >= nk:
            head = rank // (tp // nk)
            return slice(head, head + 1)
        return slice(rank * nk // tp, (rank + 1) * nk // tp)

    def rank_inputs(self, inputs, case, rank, tp):
        """Each rank's KV cache holds its KV heads only (its own allocation, as each GPU's)."""
        heads = self.rank_kv_heads(case, rank, tp)
        return dict(inputs, **{n: inputs[n][:, :, heads].contiguous() for n in self.cache_names()})

    def assemble_ranks(self, outputs, case):
        """The hidden states as every rank must hold them (after o_proj's all-reduce), then each
        cache put back together from its KV heads' owners (ranks that share a replicated head must
        have written the same)."""
        tp, n_out = len(outputs), len(self.output_names(case))
        whole = Task.assemble_ranks(self, [out[:n_out] for out in outputs], case)
        caches = []
        for i, name in enumerate(self.inplace_outputs(case), start=n_out):
            owners = {}
            for rank, out in enumerate(outputs):
                first = owners.setdefault(self.rank_kv_heads(case, rank, tp).start, rank)
                if first != rank and not torch.equal(out[i], outputs[first][i]):
                    raise RanksDisagree(f"rank {rank}'s {name} differs from rank {first}'s although they hold "
                                        "the same KV head")
            caches.append(torch.cat([outputs[r][i] for r in owners.values()], dim=2))
        return list(whole) + caches

    # ---- inputs ---------------------------------------------------------------------------------
    def heads(self, case):
        cfg = load_config(case["model"])
        return cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim(cfg)

    def metadata_and_caches(self, case, gen, device) -> Dict:
        ctx, q = case["context"], case["query"]
        _, nk, hd = self.heads(case)
        need = [-(-(c + n) // BLOCK_SIZE) for c, n in zip(ctx, q)]
        order = torch.randperm(sum(need) + 2, generator=gen, device=device).tolist()
        tables, at = [], 0
        for n in need:
            tables.append(order[at: at + n])
            at += n
        meta = AttentionMetadata.build(ctx, q, BLOCK_SIZE, device=device, block_tables=tables)
        out = {"metadata": meta}
        for i in range(self.layers):
            for kind in ("k", "v"):
                cache = activations((len(order), BLOCK_SIZE, nk, hd), gen, device, case.dtype)
                out[f"{kind}_cache_{i}"] = cache
        return out

    def cache_names(self):
        return tuple(f"{k}_cache_{i}" for i in range(self.layers) for k in ("k", "v"))

    def inplace_outputs(self, case):
        return self.cache_names()

    def mutable_inputs(self, case):
        return self.cache_names()

    def call(self, module, inputs, method=None):
        layers = [m for m in module.modules() if hasattr(m, "kv_cache")]
        for i, layer in enumerate(layers):
            layer.kv_cache = (inputs[f"k_cache_{i}"], inputs[f"v_cache_{i}"])
        return call_with_metadata(module, inputs, method, exclude=self.cache_names())

    def fuzz_strategy(self, dtype, profile):
        from hypothesis import strategies as st

        @st.composite
        def draw_case(draw):
            base = draw(st.sampled_from(self.cases(profile)))
            n = draw(st.integers(1, 4))
            ctx = [draw(st.integers(0, 70)) for _ in range(n)]
            q = [draw(st.sampled_from([1, 1, 2, 7, 17])) for _ in range(n)]
            params = dict(base.params, context=ctx, query=q)
            return Case(f"fuzz-{base.model}-ctx{'.'.join(map(str, ctx))}-q{'.'.join(map(str, q))}-{DTYPE_NAMES[dtype]}",
                        dtype, model=base.model, params=params)

        return draw_case()

    # ---- cost ---------------------------------------------------------------------------------------
    def attention_io(self, case) -> int:
        nq, nk, hd = self.heads(case)
        es = torch.finfo(case.dtype).bits // 8
        t = sum(case["query"])
        kv_read = sum(c + n for c, n in zip(case["context"], case["query"])) * nk * hd * 2
        return (2 * t * nq * hd + 2 * t * nk * hd + kv_read) * es * self.layers

    def attention_flops(self, case) -> int:
        nq, _, hd = self.heads(case)
        pairs = sum(n * (c + (n + 1) / 2) for c, n in zip(case["context"], case["query"]))
        return int(4 * nq * hd * pairs) * self.layers
