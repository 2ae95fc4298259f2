"""Mixture-of-experts tasks: the routing-aware correctness rule and the shared MoE case shapes.

Routing. At L2 and above the router logits are computed inside the module, in the model dtype. A
token whose k-th and (k+1)-th largest logits are closer than that dtype can resolve goes to
either expert in an honest implementation (rounding is monotone, so a wider gap keeps its order,
but a narrower one may become a tie or swap with a different summation order or a 1-ulp different
input), and its output then differs by O(1): no error bar can separate that from a wrong kernel.
Such tokens are left out of the comparison (``Task.undetermined_rows``): the truth's FusedMoE
modules record the float64 logits they see, and a token is undetermined when

    logit_k - logit_(k+1) < ROUTING_ULPS * eps(dtype) * max(|logit_k|, |logit_(k+1)|, rms(logits))

i.e. within a few units in the last place of the two competing logits (their own rounding), or of
the logits' typical size (the rounding the gate's input carries at L3 and L4). Softmax is monotone,
so logit order is probability order. With Qwen3-30B-A3B's 128 experts and k = 8 in bf16 a sizable
share of tokens is undetermined (the 8th and 9th logits are typically ~0.06 sigma apart): the cap
on the excluded share is 50% per draw, and one-token draws are redrawn (fk_pytest.correctness).

Where an undetermined token's difference goes: at L2 and L3 only its own row of the block's output
(the MoE block is the last step of a layer). Across layers (L4) it also reaches, in every later
layer, its own and its sequence's later tokens' rows and their K/V cache slots (attention mixes
them), so those are left out too.
"""
import dataclasses
import weakref
from typing import Callable, Dict, List, Optional, Tuple

import torch
from hypothesis import strategies as st

from fk_pytest.build import cast_copy
from fk_pytest.phases import phase
from fk_pytest.task import DTYPE_NAMES
from kernels_reference.L1.fused_moe import FusedMoE

from .configs import load_config
from .dense import DenseTask
from .workload import fuzz_cap

ROUTING_ULPS = 2.0


class RouterLogits:
    """Records, per FusedMoE module of a model in forward order, the router logits it saw (on the
    plain-PyTorch path and on the fast path alike)."""

    PATHS = ("forward_native", "forward_triton")

    def __init__(self, root: torch.nn.Module):
        self.calls: List[Tuple[str, int, torch.Tensor]] = []  # (module name, top_k, logits)
        for name, module in root.named_modules():
            if isinstance(module, FusedMoE):
                for path in self.PATHS:
                    module.__dict__.pop(path, None)  # an earlier recorder's wrapper: record here only
                    setattr(module, path, self._recording(name, module, getattr(module, path)))
        self.modules = weakref.WeakSet(m for m in root.modules() if isinstance(m, FusedMoE))

    def remove(self) -> None:
        """Take the recording wrappers off again (the module goes on to be the verdict's reference,
        copied for the interpreter's twin)."""
        for module in self.modules:
            for path in self.PATHS:
                module.__dict__.pop(path, None)

    def _recording(self, name, module, path):
        # The wrapper lives in the module's own __dict__: holding the module (or its bound method)
        # strongly would make a reference cycle, and a full-size float64 truth copy caught in one
        # waits for the cyclic collector (GBs per case on the GPU).
        top_k, func, owner = module.top_k, path.__func__, weakref.ref(module)
        calls = self.calls

        def recorded(hidden_states, router_logits):
            calls.append((name, top_k, router_logits.detach()))
            return func(owner(), hidden_states, router_logits)
        return recorded


# An honest candidate may carry about twice the reference's error, and both competing logits move.
REFERENCE_DEVIATION_FACTOR = 4.0


def reference_deviation(task, case, inputs, truth_module,
                        reference=None) -> Callable[[], List[Optional[torch.Tensor]]]:
    """Records the router logits of the reference at the case dtype on the truth's weights and
    inputs and returns, once both have run, per recorded MoE call the largest |reference logit -
    truth logit| of each token.

    ``reference``: the caller's reference module, which the caller runs on the same inputs before
    asking (the verdict's own reference run). Without one (the timed path's check), a copy of the
    truth at the case dtype runs here on the inputs rounded back to it (the values the reference
    itself gets).

    This is how far rounding upstream of the router (the attention, the norms, an earlier layer)
    moves the gate's logits in an honest implementation: at L3 and L4 it is far more than the
    logits' own last place, and a gap narrower than a few times it may honestly flip."""
    if reference is not None:
        seen = RouterLogits(reference)
    else:
        device = next(truth_module.parameters()).device
        with phase("routing", device):
            own = cast_copy(truth_module, case.dtype)
            seen = RouterLogits(own)
            low = {k: v.to(case.dtype) if isinstance(v, torch.Tensor) and v.dtype == torch.float64 else v
                   for k, v in inputs.items()}
            task.call(own, low)

    def deviations(truth_calls) -> List[Optional[torch.Tensor]]:
        seen.remove()
        if len(truth_calls) != len(seen.calls):
            return [None] * len(truth_calls)
        return [(r.to(torch.float64) - t.to(torch.float64)).abs().amax(-1)
                for (_, _, t), (_, _, r) in zip(truth_calls, seen.calls)]
    return deviations


def undetermined_tokens(logits: torch.Tensor, top_k: int, dtype: torch.dtype, ulps: float = ROUTING_ULPS,
                        deviation: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Bool [T]: tokens whose k-th and (k+1)-th logits are within rounding of each other at ``dtype``,
    or (``deviation``: per token, how far the reference's logits stray from the truth's) within
    ``REFERENCE_DEVIATION_FACTOR`` times that."""
    if top_k >= logits.shape[-1] or not dtype.is_floating_point or dtype == torch.float64:
        return torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
    logits = logits.to(torch.float64)
    top = torch.topk(logits, top_k + 1, dim=-1).values
    kth, next_ = top[:, top_k - 1], top[:, top_k]
    rms = logits.pow(2).mean(-1).sqrt()
    scale = torch.maximum(torch.maximum(kth.abs(), next_.abs()), rms)
    margin = ulps * torch.finfo(dtype).eps * scale
    if deviation is not None:
        margin = torch.maximum(margin, REFERENCE_DEVIATION_FACTOR * deviation.to(margin.device, torch.float64))
    return (kth - next_) < margin


def token_rule(outputs: Tuple[str, ...], ulps: float = ROUTING_ULPS) -> Callable:
    """The hook for tasks whose MoE block is the last step (L2 block, L3 layer; a 2-layer DeepSeek
    model, whose only MoE layer is its last): an undetermined token (in any of the module's MoE
    calls) leaves out its own row of ``outputs``."""
    def undetermined_rows(self, case, inputs, truth_module, reference=None):
        deviations = reference_deviation(self, case, inputs, truth_module, reference)
        seen = RouterLogits(truth_module)

        def masks():
            if not seen.calls:
                return {}
            tokens = torch.stack([undetermined_tokens(x, k, case.dtype, ulps, deviation=dev) for (_, k, x), dev
                                  in zip(seen.calls, deviations(seen.calls))]).any(0)
            return {name: tokens for name in outputs}
        return masks
    return undetermined_rows


def layer_of(module_name: str) -> int:
    """``model.layers.3.mlp.experts`` -> 3."""
    parts = module_name.split(".")
    return int(parts[parts.index("layers") + 1])


def float32_cases(cases):
    """The 2-layer MoE model tasks (L4) score in float32. In bf16 the rounding of embedding, two
    attentions and a first MoE layer moves the last router's logits by more than the gap between
    the k-th and (k+1)-th expert of most tokens (Qwen3-30B-A3B's cut, decode B3: every token of
    four draws undetermined by the reference's own deviation), so almost nothing would be left to
    score; in float32 the routing is determined and the comparison is a real one. bf16 routing at
    model level is the end-to-end cases' job (teacher-forced agreement against the noise floor)."""
    out = []
    for c in cases:
        out.append(dataclasses.replace(c, dtype=torch.float32, id=c.id.replace("-bf16", "-fp32")))
    return out


L4_ROUTING_ULPS = 4.0  # two layers of bf16 rounding (interpreted Triton truncates) reach the last gate


def model_rule(self, case, inputs, truth_module, reference=None):
    """The hook for whole models (L4) over the paged cache: an undetermined token at layer l also
    leaves out its sequence's later tokens, and their K/V cache slots in layers after l."""
    deviations = reference_deviation(self, case, inputs, truth_module, reference)
    seen = RouterLogits(truth_module)
    meta = inputs["metadata"]

    def masks():
        tokens = len(meta.slot_mapping)
        rows = torch.zeros(tokens, dtype=torch.bool)
        caches = {name: None for name in self.cache_names()}
        layers = len(self.cache_names()) // 2
        starts = meta.query_start_loc.tolist()
        for (name, k, logits), dev in zip(seen.calls, deviations(seen.calls)):
            layer = layer_of(name)
            bad = undetermined_tokens(logits, k, case.dtype, getattr(self, "routing_ulps", L4_ROUTING_ULPS),
                                      deviation=dev).cpu()
            spread = bad.clone()
            if layer < layers - 1:  # a later layer's attention carries it to the sequence's later tokens
                for s, e in zip(starts[:-1], starts[1:]):
                    hit = bad[s:e].nonzero()
                    if len(hit):
                        spread[s + int(hit[0]):e] = True
            rows |= spread
            slots = meta.slot_mapping.cpu()[spread]
            for later in range(layer + 1, layers):
                for kind in ("k", "v"):
                    cache = inputs[f"{kind}_cache_{later}"]
                    mask = caches[f"{kind}_cache_{later}"]
                    if mask is None:
                        mask = caches[f"{kind}_cache_{later}"] = torch.zeros(cache.shape[:2], dtype=torch.bool)
                    mask.view(-1)[slots] = True
        out = {name: rows for name in self.output_names(case)}
        out.update({n: m.to(inputs["metadata"].slot_mapping.device) for n, m in caches.items() if m is not None})
        return out
    return masks


# ---- L2 block tasks ----------------------------------------------------------------------------------
# CPU profile: a cut of each real config: its real E and k, narrower hidden and expert widths (a
# float64 truth of 128 full-width experts is too slow for the interpreter's budget).
CPU_CUT = {"hidden_size": 256, "moe_intermediate_size": 64}
# Models with more experts than the interpreter can afford per case keep k but fewer experts on the
# CPU profile (Qwen3-Next's 512 experts cost ~100 s a task there; 64 keep top-10 routing sparse).
CPU_EXPERTS = {"qwen3-next-80b-a3b": 64}
MOE_TOKENS = {"cpu": {"decode": (1, 5), "prefill": (33,)},
              "full": {"decode": (1, 32, 128), "prefill": (1024, 8192)}}
MAX_BLOCK_TOKENS = 8192  # the captures' steps stop at the engine's 8192-token budget


def block_token_cases(model: str, profile: str, cls: str):
    """(phase, tokens, weight, source) of an L2 MoE block: the token counts of the model's captured
    calls of ``cls`` with their call shares (full profile, where a capture exists), else hand-picked."""
    from .workloads import load_capture
    from .workload import token_cases

    if profile == "full" and load_capture(model) is not None:
        return token_cases(model, profile, cls, max_tokens=MAX_BLOCK_TOKENS)[""]
    hand = [(phase, t) for phase, counts in MOE_TOKENS[profile].items() for t in counts]
    weight = 1.0 if profile == "cpu" else 1.0 / len(hand)
    return [(phase, t, weight, "hand-picked") for phase, t in hand]


def cut_config(model: str, profile: str) -> Dict:
    """The model's config; on the CPU profile narrowed to ``CPU_CUT`` (k and layers kept; E kept
    except where ``CPU_EXPERTS`` cuts it)."""
    cfg = dict(load_config(model))
    if profile == "cpu":
        cfg.update(hidden_size=CPU_CUT["hidden_size"], head_dim=32,
                   num_attention_heads=min(cfg["num_attention_heads"], 8),
                   num_key_value_heads=min(cfg.get("num_key_value_heads") or cfg["num_attention_heads"], 4))
        if "moe_intermediate_size" in cfg:
            cfg["moe_intermediate_size"] = CPU_CUT["moe_intermediate_size"]
        cfg["intermediate_size"] = CPU_CUT["moe_intermediate_size"] * (2 if "moe_intermediate_size" in cfg else 1)
        if model in CPU_EXPERTS:
            cfg["num_experts"] = CPU_EXPERTS[model]
    return cfg


class MoEBlockTask(DenseTask):
    """An L2 MoE block: hidden states in, hidden states out; weights from a (cut) real config.

    Subclasses give ``block_args(cfg) -> init args`` and ``models``. Token counts: the captured
    calls of the block's class (full profile; ``block_token_cases``). FLOPs/bytes count the k
    routed experts per token (plus shared experts) and every expert's weights read once."""

    family = "moe"
    level = 2
    input_name = "hidden_states"
    undetermined_rows = token_rule(("out",))

    def block_args(self, cfg) -> Dict:
        raise NotImplementedError

    def expert_widths(self, init) -> Tuple[int, int, int, int]:
        """(experts, k, expert width, dense width per token outside the routed experts)."""
        raise NotImplementedError

    def cases(self, profile):
        from fk_pytest import Case
        from .workload import model_dtype

        out = []
        for model in self.models:
            cfg, dt = cut_config(model, profile), model_dtype(model)
            init = self.block_args(cfg)
            for phase, t, weight, source in block_token_cases(model, profile, self.reference.__name__):
                out.append(Case(f"{model}-{phase}-T{t}-{DTYPE_NAMES[dt]}", dt, model=model, weight=weight,
                                params=dict(init=init, tokens=t, fan_in=cfg["hidden_size"],
                                            fan_out=cfg["hidden_size"], pad=0, profile=profile, source=source)))
        return out

    def fuzz_strategy(self, dtype, profile):
        from fk_pytest import Case
        from fk_pytest.fuzz import token_counts

        @st.composite
        def draw_case(draw):
            model = draw(st.sampled_from(self.models))
            cfg = cut_config(model, profile)
            init = self.block_args(cfg)
            t = fuzz_cap(draw(token_counts(300)), 16 * cfg["hidden_size"], profile)
            pad = draw(st.sampled_from([0, 0, 8]))
            return Case(f"fuzz-{model}-T{t}-pad{pad}-{DTYPE_NAMES[dtype]}", dtype, model=model,
                        params=dict(init=init, tokens=t, fan_in=cfg["hidden_size"], fan_out=cfg["hidden_size"],
                                    pad=pad, profile=profile))

        return draw_case()

    def io_bytes(self, case):
        e, k, width, dense = self.expert_widths(case["init"])
        t, h = case["tokens"], case["fan_in"]
        touched = min(e, t * k)  # experts that receive a token (all of them once t * k >= E)
        return (2 * t * h + touched * 3 * h * width + 3 * h * dense + h * e) * torch.finfo(case.dtype).bits // 8

    def flops(self, case):
        e, k, width, dense = self.expert_widths(case["init"])
        t, h = case["tokens"], case["fan_in"]
        return 2 * t * (h * e + 3 * h * (k * width + dense))


# ---- L3 / L4 over the paged cache ------------------------------------------------------------------
def moe_arch_config(model: str, profile: str, layers: int = 1, vocab_shard: int = 1):
    """LlamaArchConfig of a MoE model: on the CPU profile its ``cut_config``; ``layers`` deep. The
    Qwen3-MoE cut makes layer 0 dense (``mlp_only_layers``, a real config switch) when 2+ layers
    deep, so a routing near-tie (a third of its bf16 tokens have one) cannot spread through the next
    layer's attention into a whole prefill sequence."""
    from kernels_reference.model_config import LlamaArchConfig

    cfg = cut_config(model, profile)
    cfg["num_hidden_layers"] = layers
    cfg["vocab_size"] = cfg["vocab_size"] // vocab_shard
    if cfg.get("num_experts", 0) >= 64 and layers > 1:
        cfg["mlp_only_layers"] = [0]
    return LlamaArchConfig.from_hf(cfg)


LAYER_MODELS = ("mixtral-8x7b", "qwen3-30b-a3b")  # DeepSeek-V2 has its own L3/L4 tasks (MLA)


def paged_heads(model: str, profile: str):
    c = moe_arch_config(model, profile)
    return c.num_attention_heads, c.num_key_value_heads, c.head_dim


def moe_weight_elems(c, layers: int) -> Tuple[int, int]:
    """(weights read, weights used per token) per layer stack, in elements, for bytes/FLOPs."""
    attn = c.hidden_size * (2 * c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim
    experts = 3 * c.hidden_size * c.moe_intermediate_size
    per_layer_read = attn + c.num_experts * (experts + c.hidden_size)
    per_layer_used = attn + c.top_k * experts + c.num_experts * c.hidden_size
    return layers * per_layer_read, layers * per_layer_used


class MoELayerTask:
    """Mixin for the MoE decoder-layer (L3) and model (L4) tasks over the paged cache: cases per
    MoE model at its (cut) config; heads and costs from that config."""

    tp_degrees = ()  # FusedMoE shards (every expert's slice per rank); the MoE tasks' TP checks live in tests

    models = {"cpu": LAYER_MODELS, "full": LAYER_MODELS}
    depth = 1
    vocab_shards = {"cpu": 1, "full": 1}

    def config(self, case):
        return moe_arch_config(case["model"], case["profile"], self.depth, case.params.get("vocab_shard", 1))

    def heads(self, case):
        return paged_heads(case["model"], case["profile"])

    def io_bytes(self, case):
        read, _ = moe_weight_elems(self.config(case), self.depth)
        return self.attention_io(case) + read * torch.finfo(case.dtype).bits // 8

    def flops(self, case):
        _, used = moe_weight_elems(self.config(case), self.depth)
        return self.attention_flops(case) + 2 * sum(case["query"]) * used
