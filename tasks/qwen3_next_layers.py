"""What the Qwen3-Next layer and model tasks (L3 ``qwen3_next_decoder_layer``, L4
``qwen3_next_for_causal_lm``) share: the config cut to a profile, trained-scale weights for every
block inside, the engine steps a case runs, their fuzzed variants, and the routing rule of the
hybrid stack.

A case is one engine step: sequences with ``context`` tokens already folded into their states (and
held in the paged KV cache) and ``query`` new ones, decodes first (vLLM's order). The gated
DeltaNet layers' pools and the attention layers' caches are inputs and in-place outputs
(``tasks/state_steps.py``, ``tasks/paged.py``).

CPU profile: the MoE cut of the L2 MoE task (``tasks/moe.py`` cut_config: hidden 256, 64 of the
512 experts, top-10, expert width 64, the real shared-expert width 512); the gated DeltaNet with the
real head dims (128) and 2 key / 4 value heads (``tasks/linear_inputs.py``); the gated attention
with the real head_dim 256 and rotary quarter at 2 query heads / 1 KV head. Steps are short (chunk
crossings are the L1/L2 tasks' business; the fuzz crosses the 64-token chunk): a decode batch, and a
mixed step holding both phases (a fresh and a continued prefill after two decodes); prefill-only
steps come from the fuzz.
"""
from typing import List, Optional, Sequence, Tuple

import torch
from hypothesis import strategies as st

from fk_pytest import Case
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L2.qwen3_next_gated_delta_net import Qwen3NextGatedDeltaNet
from kernels_reference.qwen3_next_config import Qwen3NextArchConfig

from .configs import load_config
from .dense import DenseTask
from .gated_delta_inputs import STATE_SCALE, decay_rates
from .linear_inputs import (CPU_HEADS, GATED_DELTA_CHUNK, decode_batches, prefill_batches,
                            zero_centred_norm_weights)
from .moe import L4_ROUTING_ULPS, RouterLogits, cut_config, layer_of, reference_deviation, undetermined_tokens

CPU_ATTENTION_HEADS = (2, 1)  # (query heads, KV heads) at the real head_dim 256
PATTERN_LAYERS = 4  # three gated DeltaNet layers, then one full-attention layer

# CPU steps: (name, [(context, query)] with the decodes first).
CPU_STEPS = [("decode-B3", [(17, 1), (70, 1), (123, 1)]),
             ("mixed-D2-P2", [(17, 1), (70, 1), (0, 13), (40, 6)])]


def full_steps() -> List[Tuple[str, List[Tuple[int, int]]]]:
    """The full profile's steps: the gated DeltaNet task's prefill and decode batches (prefills
    alternating fresh and continuing sequences) and a serving-sized mixed step."""
    out = []
    for name, lengths in prefill_batches(GATED_DELTA_CHUNK, "full"):
        if name == "long":  # a 32k-token prefill is the L1/L2 tasks' speed case
            continue
        out.append((f"prefill-{name}", [(0 if i % 2 == 0 else 1 + (37 * i + 11) % 300, n)
                                         for i, n in enumerate(lengths)]))
    for name, n in decode_batches("full"):
        out.append((f"decode-{name}", [(1 + (37 * (i + 1) + 11) % 2000, 1) for i in range(n)]))
    out.append(("mixed-D32-P2", [(1 + (53 * i) % 1500, 1) for i in range(32)] + [(0, 512), (45, 1500)]))
    return out


def steps(profile: str):
    return CPU_STEPS if profile == "cpu" else full_steps()


MODEL_PREFILL_CHUNK = 256  # the longest prefill chunk of the model task's full-profile steps


def model_steps(profile: str):
    """The model task's steps (L4). A token whose 10th and 11th router logits are within rounding
    leaves out its sequence's later rows at every later layer (``hybrid_model_rule``). On the H200
    (2026-12-04, float32) 0.02-0.2% of a 4096-token prompt's tokens were undetermined per layer,
    the first of them at token 62-2980, so each draw of that step lost 90-98% of its rows, over the
    50% cap. The model task therefore prefills 16 sequences in chunks of 256 tokens (chunked prefill
    at a small token budget; fresh and continuing alternate), 4096 tokens in all: on the H200 its
    draws were scored. The long prompts are the layer tasks' (L1..L3)."""
    if profile == "cpu":
        return CPU_STEPS
    chunk = MODEL_PREFILL_CHUNK
    chunks = [(0 if i % 2 == 0 else 1 + (37 * i + 11) % 300, chunk) for i in range(4096 // chunk)]
    decodes = [(1 + (53 * i) % 1500, 1) for i in range(32)]
    return ([(f"prefill-{len(chunks)}x{chunk}", chunks)]
            + [(f"decode-{name}", [(1 + (37 * (i + 1) + 11) % 2000, 1) for i in range(n)])
               for name, n in decode_batches("full")]
            + [("mixed-D32-P4", decodes + chunks[:4])])


def arch_config(model: str, profile: str, layers: int = PATTERN_LAYERS, vocab_shard: int = 1) -> Qwen3NextArchConfig:
    """The model's config cut to ``profile``, ``layers`` deep with its 3 : 1 layer pattern."""
    cfg = cut_config(model, profile)
    if profile == "cpu":
        real = load_config(model)
        k_heads, v_heads = CPU_HEADS[model]
        cfg.update(head_dim=real["head_dim"], num_attention_heads=CPU_ATTENTION_HEADS[0],
                   num_key_value_heads=CPU_ATTENTION_HEADS[1], linear_num_key_heads=k_heads,
                   linear_num_value_heads=v_heads)
    cfg["num_hidden_layers"] = layers
    cfg["vocab_size"] = cfg["vocab_size"] // vocab_shard
    return Qwen3NextArchConfig.from_hf(cfg)


def step_case(model: str, name: str, seqs: Sequence[Tuple[int, int]], dtype, params: dict,
              weight: float = 1.0) -> Case:
    return Case(f"{model}-{name}-{DTYPE_NAMES[dtype]}", dtype, model=model, weight=weight,
                params=dict(params, context=[c for c, _ in seqs], query=[q for _, q in seqs]))


class Qwen3NextStackTask:
    """Mixin (listed before StateTask / PagedTask) for a stack of Qwen3-Next layers: config,
    heads, state shapes, weights and fuzz of a case (``case["profile"]``)."""

    def config(self, case) -> Qwen3NextArchConfig:
        return arch_config(case.model, case["profile"], vocab_shard=case.params.get("vocab_shard", 1))

    def heads(self, case):
        c = self.config(case)
        return c.num_attention_heads, c.num_key_value_heads, c.head_dim

    def state_shapes(self, case):
        c = self.config(case)
        return c.conv_state_shape(), c.ssm_state_shape(), STATE_SCALE

    def init_weights(self, module, gen):
        # Matrices and experts at trained scale (DenseTask), the zero-centred norms near 0, and each
        # gated DeltaNet's own parameters as in its L2 task (decays from slow to fast, conv taps,
        # the gated norm's plain weight near 1).
        DenseTask.init_weights(self, module, gen)
        zero_centred_norm_weights(module, gen)
        with torch.no_grad():
            for block in module.modules():
                if isinstance(block, Qwen3NextGatedDeltaNet):
                    dev = block.A_log.device
                    block.A_log.copy_(decay_rates(block.A_log.numel(), gen, dev).log())
                    block.dt_bias.copy_(0.5 * torch.randn(block.dt_bias.shape, generator=gen, device=dev))
                    conv = block.conv1d.weight
                    conv.copy_(0.5 * torch.randn(conv.shape, generator=gen, device=dev))
                    norm = block.norm.weight
                    norm.copy_(1 + 0.2 * torch.randn(norm.shape, generator=gen, device=dev))

    def fuzz_strategy(self, dtype, profile):
        bases = self.cases(profile)
        budget = 96 if profile == "cpu" else 4096

        @st.composite
        def draw_case(draw):
            base = draw(st.sampled_from(bases))  # every layer kind of the task
            decodes = draw(st.integers(0, 3 if profile == "cpu" else 64))
            chunk = GATED_DELTA_CHUNK
            length = st.one_of(st.sampled_from([1, chunk - 1, chunk, chunk + 1]), st.integers(1, 2 * chunk + 7))
            queries = draw(st.lists(length, min_size=0 if decodes else 1, max_size=2))
            while len(queries) > 1 and sum(queries) > budget:
                queries.pop()
            seqs = [(draw(st.integers(1, 300)), 1) for _ in range(decodes)]
            seqs += [(draw(st.sampled_from([0, 0, 1, 3, 64, 200])), n) for n in queries]
            ident = "_".join(f"{c}+{q}" for c, q in seqs) if len(seqs) <= 4 else f"D{decodes}-P{len(queries)}"
            params = {k: v for k, v in base.params.items() if k not in ("context", "query")}
            kind = f"{params['layer_type']}-" if "layer_type" in params else ""
            return step_case(base.model, f"fuzz-{kind}{ident}", seqs, dtype, params)

        return draw_case()


def hybrid_model_rule(self, case, inputs, truth_module, reference=None):
    """Routing-aware correctness of a hybrid stack (L4): a token whose router is undetermined at
    layer l (``tasks/moe.py``) changes its own row, and every later layer carries the change to its
    sequence's later tokens -- through a full-attention layer's mixing (and that layer's K/V rows of
    those tokens) and through a linear-attention layer's scan (and that layer's state slot of the
    sequence). Those rows, cache rows and state slots are left out."""
    deviations = reference_deviation(self, case, inputs, truth_module, reference)
    seen = RouterLogits(truth_module)
    meta = inputs["metadata"]
    types = self.config(case).layer_types
    state_index = {l: i for i, l in enumerate(l for l, t in enumerate(types) if t == "linear_attention")}
    cache_index = {l: i for i, l in enumerate(l for l, t in enumerate(types) if t == "full_attention")}
    pool_names = self.pool_names()

    def masks():
        starts = meta.query_start_loc.tolist()
        rows = torch.zeros(len(meta.slot_mapping), dtype=torch.bool)
        out: dict = {}
        for (name, k, logits), dev in zip(seen.calls, deviations(seen.calls)):
            layer = layer_of(name)
            bad = undetermined_tokens(logits, k, case.dtype, L4_ROUTING_ULPS, deviation=dev).cpu()
            spread, hit_seqs = bad.clone(), []
            if layer < len(types) - 1:
                for i, (s, e) in enumerate(zip(starts[:-1], starts[1:])):
                    hit = bad[s:e].nonzero()
                    if len(hit):
                        spread[s + int(hit[0]):e] = True
                        hit_seqs.append(i)
            rows |= spread
            for later in range(layer + 1, len(types)):
                if later in cache_index:
                    slots = meta.slot_mapping.cpu()[spread]
                    for kind in ("k", "v"):
                        _mark(out, f"{kind}_cache_{cache_index[later]}", inputs, slots, flat=True)
                else:
                    pool_slots = meta.state_slots.cpu()[hit_seqs].long()
                    for which in (0, 1):
                        _mark(out, pool_names[2 * state_index[later] + which], inputs, pool_slots)
        out.update({n: rows for n in self.output_names(case)})
        return {n: m.to(meta.slot_mapping.device) for n, m in out.items()}
    return masks


def _mark(masks: dict, name: str, inputs, index: torch.Tensor, flat: bool = False) -> None:
    """Exclude ``index`` rows of input ``name`` (``flat``: token slots of a [blocks, block_size] cache)."""
    tensor = inputs[name]
    shape = tensor.shape[:2] if flat else tensor.shape[:1]
    mask: Optional[torch.Tensor] = masks.get(name)
    if mask is None:
        mask = masks[name] = torch.zeros(shape, dtype=torch.bool)
    mask.view(-1)[index] = True


def layer_flops(c: Qwen3NextArchConfig, case, layer_type: str) -> int:
    """GEMM and scan FLOPs of one layer of ``layer_type`` on the case's tokens (the attention's
    score and value products are PagedTask.attention_flops')."""
    t, h = sum(case["query"]), c.hidden_size
    if layer_type == "linear_attention":
        kd, vd = c.linear_num_key_heads * c.linear_key_head_dim, c.linear_num_value_heads * c.linear_value_head_dim
        proj = h * (2 * kd + 2 * vd + 2 * c.linear_num_value_heads) + vd * h
        mixer = 2 * t * proj + 7 * t * c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim
    else:
        mixer = 2 * t * h * (3 * c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim
    moe = 3 * h * (c.num_experts_per_tok * c.moe_intermediate_size + c.shared_expert_intermediate_size)
    return mixer + 2 * t * (h * c.num_experts + moe)


def layer_weight_bytes(c: Qwen3NextArchConfig, case, layer_type: str) -> int:
    """Weights one layer reads (every expert a token reaches: all of them once t * k >= E) and its
    state slots read and written."""
    t, h = sum(case["query"]), c.hidden_size
    half = torch.finfo(case.dtype).bits // 8
    if layer_type == "linear_attention":
        kd, vd = c.linear_num_key_heads * c.linear_key_head_dim, c.linear_num_value_heads * c.linear_value_head_dim
        weights = h * (2 * kd + 2 * vd + 2 * c.linear_num_value_heads) + vd * h
        states = 2 * len(case["query"]) * (c.conv_state_shape()[0] * c.conv_state_shape()[1] * half
                                           + 4 * c.linear_num_value_heads * c.linear_key_head_dim
                                           * c.linear_value_head_dim)
    else:
        weights, states = h * (3 * c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim, 0
    touched = min(c.num_experts, t * c.num_experts_per_tok)
    weights += h * c.num_experts + 3 * h * (touched * c.moe_intermediate_size + c.shared_expert_intermediate_size)
    return weights * half + states
