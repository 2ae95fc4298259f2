"""Workload capture: run a model through the engine on a scenario and record what every module sees.

For every reference module (they all inherit :class:`~kernels_reference.records.RecordsInit`, so
their constructor arguments are known) a forward pre-hook records the forward arguments: shape,
dtype and strides of tensors, the value of ``None`` / numbers. Calls are grouped per
(module class, init args, argument pattern) where the pattern writes every tensor's leading dimension
(the token or sequence count, which changes every step) as ``"n"``; each group keeps a histogram of
call counts over (step phase, n). The instances of all layers fold into one group, so their counts
add up. Each step's batch composition is recorded from the forward context (decode sequences and
their context lengths, prefill chunks as (context, query) pairs), bucketed: attention layers and the
state layers of Mamba-2 and Qwen3-Next read the same per-sequence lengths from it.

Depth: layer 0 is special (its input norm gets no residual) and layers 1..L-1 of one kind are
identical in code and shapes, so a capture may run only the first ``layers`` layers and count each
run layer's calls for the layers of its kind it stands for. A plain stack has one kind (2 layers
suffice: layer 1 counts L-1 times); a hybrid has several (Qwen3-Next's ``layer_types``: three gated
DeltaNet layers, then one full-attention layer, so its first 4 layers hold one of each after layer
0). The capture says so (``layers_run``). On the ``meta`` device nothing is computed
(shapes exact, no arithmetic), which is how the 7-8B models are captured on a CPU; the sampler is
then a synthetic one (meta logits cannot be argmaxed) and outputs run to their full length.

Phase of a step: ``decode`` (every sequence has one query token), ``prefill`` (none has one),
``mixed``. The LM head runs after the step's forward context closes: it gets the step's phase.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import random
from collections import Counter, defaultdict
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from ..forward_context import AttentionMetadata, get_forward_context
from ..records import RecordsInit
from .llm import LLM, SamplingParams
from .scenarios import Scenario

SCHEMA_VERSION = 1
SIGNIFICANT_BITS = 5  # attention step summaries keep lengths to within 1/16, rounded down


# ---- what one argument looks like ------------------------------------------------------------------
def jsonable(value: Any) -> Any:
    """Init args and argument values as JSON (configs as dicts, tensors as signatures)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value))
    if isinstance(value, torch.Tensor):
        return tensor_signature(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return {"type": type(value).__name__}


def tensor_signature(t: torch.Tensor) -> Dict[str, Any]:
    return {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""), "stride": list(t.stride())}


def argument_pattern(arguments: Dict[str, Any]) -> Tuple[Dict[str, Any], Optional[int]]:
    """(pattern with every tensor's leading dim as "n", that n); concrete when leading dims differ."""
    tensors = [v for v in arguments.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
    leading = {t.shape[0] for t in tensors}
    pattern = {k: jsonable(v) for k, v in arguments.items()}
    if len(leading) != 1:
        return pattern, (tensors[0].shape[0] if tensors else None)
    for k, v in arguments.items():
        if isinstance(v, torch.Tensor) and v.dim() > 0:
            pattern[k]["shape"][0] = "n"
    return pattern, leading.pop()


def step_phase(meta: AttentionMetadata) -> str:
    q = meta.query_lens_cpu
    if all(n == 1 for n in q):
        return "decode"
    return "prefill" if all(n > 1 for n in q) else "mixed"


def coarse(x: int, bits: int = SIGNIFICANT_BITS) -> int:
    """Keep ``bits`` significant bits (exact below 2**bits), rounding down: a bucketed length never
    exceeds the real one, so a rebuilt step stays within the model's positions."""
    shift = max(0, int(x).bit_length() - bits)
    return int(x) >> shift << shift


def quantiles(values: Sequence[int]) -> List[int]:
    """min, p25, p50, p75, max (nearest rank), coarsened."""
    s = sorted(values)
    return [coarse(s[min(len(s) - 1, int(round(f * (len(s) - 1))))]) for f in (0, 0.25, 0.5, 0.75, 1)]


def step_summary(meta: AttentionMetadata) -> Dict[str, Any]:
    """A step's batch composition, bucketed: decode count and context quantiles, prefill chunks."""
    decode_ctx, prefill = [], []
    for q, n in zip(meta.query_lens_cpu, meta.seq_lens_cpu):
        if q == 1:
            decode_ctx.append(n - 1)
        else:
            prefill.append([coarse(n - q), coarse(q)])
    return {"decode": [len(decode_ctx)] + quantiles(decode_ctx) if decode_ctx else None,
            "prefill": sorted(prefill)}


# ---- the recorder ----------------------------------------------------------------------------------
class Recorder:
    """Forward pre-hooks on every reference module of a model; ``multiplier`` per module name."""

    def __init__(self, model: torch.nn.Module, multiplier: Dict[str, int]):
        self.groups: Dict[str, Dict[str, Any]] = {}
        self.counts: Dict[str, Counter] = defaultdict(Counter)
        self.steps: Counter = Counter()
        self.num_steps = 0
        self._phase, self._last_meta = "none", None
        self._handles = []
        for name, module in model.named_modules():
            if isinstance(module, RecordsInit):
                self._handles.append(module.register_forward_pre_hook(
                    self._hook(name, module, multiplier.get(name, 1)), with_kwargs=True))

    def _hook(self, name: str, module: torch.nn.Module, times: int):
        signature = inspect.signature(module.forward)
        init = group_init(module)
        cls = type(module).__name__

        def hook(mod, args, kwargs):
            meta = get_forward_context()
            if meta is not None:
                self._phase = step_phase(meta)
                if meta is not self._last_meta:  # a new step (every layer sees the same metadata)
                    self._last_meta = meta
                    self.num_steps += 1
                    self.steps[_key(step_summary(meta))] += 1
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()  # every parameter named, e.g. a norm's residual=None
            pattern, n = argument_pattern(dict(bound.arguments))
            group = {"class": cls, "init": init, "args": pattern}
            key = _key(group)
            self.groups.setdefault(key, group)
            self.counts[key][(self._phase, n)] += times

        return hook

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def modules(self) -> List[Dict[str, Any]]:
        out = []
        for key, group in self.groups.items():
            hist: Dict[str, Dict[str, int]] = defaultdict(dict)
            for (phase, n), c in sorted(self.counts[key].items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
                hist[phase][str(n)] = c
            out.append(dict(group, calls=sum(self.counts[key].values()), counts=dict(hist)))
        return sorted(out, key=lambda g: (g["class"], -g["calls"]))

    def attention_steps(self) -> List[Dict[str, Any]]:
        rows = [dict(_unkey(k), count=c) for k, c in self.steps.items()]
        return sorted(rows, key=lambda r: -r["count"])


def group_init(module: torch.nn.Module) -> Dict[str, Any]:
    """A module's init args as its group records them: without the layer index, so that the layers
    of one kind fold into one group; a hybrid's layer names its kind instead (``layer_type``, from
    the config's ``layer_types``), so that its kinds stay apart."""
    init = jsonable(getattr(module, "init_args", {}))
    index = init.pop("layer_idx", None)
    types = init.get("config", {}).get("layer_types") if isinstance(init.get("config"), dict) else None
    if index is not None and types:
        init["layer_type"] = types[index]
    return init


def _key(obj) -> str:
    return json.dumps(obj, sort_keys=True)


def _unkey(key: str):
    return json.loads(key)


class SyntheticSampler:
    """Stands in for sampling when logits hold no values (meta device): a seeded token per call."""

    def __init__(self, vocab_size: int, seed: int = 0):
        self.vocab_size, self.seed = vocab_size, seed
        self.reset()

    def reset(self) -> None:
        self.rng = random.Random(self.seed)

    def __call__(self, logits: torch.Tensor, params: SamplingParams) -> int:
        return self.rng.randrange(self.vocab_size)


@contextlib.contextmanager
def _meta_masks(on: bool):
    """Boolean-mask indexing on meta tensors (the KV store skips padded slots with one) needs a
    size: assume every element selected, which is exact here (the capture pads nothing)."""
    try:
        from torch.fx.experimental import _config as fx_config
    except ImportError:
        fx_config = None
    name = "meta_nonzero_assume_all_nonzero"
    if not on or fx_config is None or not hasattr(fx_config, name):
        yield
        return
    old = getattr(fx_config, name)
    setattr(fx_config, name, True)
    try:
        yield
    finally:
        setattr(fx_config, name, old)


# ---- one capture -----------------------------------------------------------------------------------
def architecture(config: Dict[str, Any]):
    """The reference model class the HF-style ``config`` builds, and its own config."""
    from ..L4.llama import architecture_of, model_class

    cls = model_class(architecture_of(config))
    return cls, cls.config_class.from_hf(config)


def layer_kinds(config: Dict[str, Any]) -> List[str]:
    """What each layer of the model is: a hybrid's ``layer_types`` (Qwen3-Next: gated DeltaNet or
    full attention), else one kind for every layer."""
    _, arch = architecture(config)
    kinds = getattr(arch, "layer_types", None)
    return list(kinds) if kinds else ["layer"] * config["num_hidden_layers"]


def carries_states(config: Dict[str, Any]) -> bool:
    """Whether the model keeps a recurrent state per sequence (Mamba-2, Qwen3-Next)."""
    return hasattr(architecture(config)[0], "allocate_state_pools")


def layers_needed(kinds: Sequence[str]) -> int:
    """The fewest leading layers a depth-cut capture must run: layer 0 (it differs: no residual in)
    and, after it, at least one layer of every kind that layers 1.. have."""
    first = {}
    for i, kind in enumerate(kinds[1:], start=1):
        first.setdefault(kind, i)
    return max([2] + [i + 1 for i in first.values()])


def layer_multipliers(model: torch.nn.Module, run_layers: int, kinds: Sequence[str]) -> Dict[str, int]:
    """Calls of layer 0 count once; the layers 1..run-1 of each kind stand for all layers 1.. of that
    kind (identical in code and shapes), spread evenly over them."""
    total = len(kinds)
    if run_layers == total:
        return {}
    if run_layers < layers_needed(kinds):
        missing = sorted(set(kinds[1:]) - set(kinds[1:run_layers]))
        raise ValueError(f"a depth-truncated capture of this model needs >= {layers_needed(kinds)} layers "
                         f"(layer 0 differs: no residual in" + (f"; no layer of kind {missing} among layers "
                         f"1..{run_layers - 1}" if missing else "") + f"), got {run_layers}")
    per_layer = {}
    for kind in set(kinds[1:]):
        stand_ins = [i for i in range(1, run_layers) if kinds[i] == kind]
        rest = sum(1 for k in kinds[1:] if k == kind)
        for j, i in enumerate(stand_ins):
            per_layer[i] = rest // len(stand_ins) + (1 if j < rest % len(stand_ins) else 0)
    out = {}
    for name, _ in model.named_modules():
        parts = name.split(".")
        if "layers" in parts[:-1]:
            i = int(parts[parts.index("layers") + 1])
            if i >= 1:
                out[name] = per_layer[i]
    return out


def capture(config: Dict[str, Any], scenario: Scenario, *, layers: Optional[int] = 2, seed: int = 0,
            scale: float = 1.0, device: str = "meta", dtype: torch.dtype = torch.bfloat16) -> Dict[str, Any]:
    """Run ``scenario`` through the engine on a model built from the HF-style ``config`` (dict)."""
    from ..L4.llama import model_for

    total, kinds = config["num_hidden_layers"], layer_kinds(config)
    run_layers = total if layers is None else min(layers, total)
    cut = dict(config, num_hidden_layers=run_layers)
    if "layer_types" in config:  # a hybrid's explicit pattern, cut with the depth
        cut["layer_types"] = list(config["layer_types"])[:run_layers]
    with torch.device(device):
        model = model_for(cut).to(dtype)
    args = dict(scenario.engine_args)
    block_size = args.get("block_size", 16)
    llm = LLM(model, num_blocks=scenario.num_blocks(block_size, scale), **args)
    requests = scenario.requests(config["vocab_size"], seed=seed, scale=scale)
    shape_only = device == "meta"
    if shape_only:
        llm.sampler = SyntheticSampler(config["vocab_size"], seed)
    recorder = Recorder(model, layer_multipliers(model, run_layers, kinds))
    try:
        with _meta_masks(shape_only):
            llm.generate([p for p, _ in requests], [SamplingParams(max_tokens=n) for _, n in requests])
    finally:
        recorder.remove()
    modules = recorder.modules()
    for group in modules:  # modules that took the (depth-truncated) config record the real depth
        cfg = group["init"].get("config")
        if isinstance(cfg, dict) and "num_hidden_layers" in cfg:
            cfg["num_hidden_layers"] = total
            if "layer_types" in cfg:
                cfg["layer_types"] = list(kinds)
    return {
        "description": scenario.description,
        "engine_args": args,
        "seed": seed, "scale": scale,
        "requests": len(requests),
        "prompt_tokens": sum(len(p) for p, _ in requests),
        "output_tokens": sum(n for _, n in requests),
        "steps": recorder.num_steps,
        "modules": modules,
        "attention_steps": recorder.attention_steps(),
    }


def capture_model(config: Dict[str, Any], scenarios: Sequence[Scenario], *, model_name: str,
                  layers: Optional[int] = 2, seed: int = 0, scale: float = 1.0, device: str = "meta",
                  dtype: torch.dtype = torch.bfloat16, progress=None) -> Dict[str, Any]:
    """One model's capture file: every scenario, with how the capture was made. ``progress``
    (text -> None) hears of each scenario as it starts: a full capture takes minutes."""
    total = config["num_hidden_layers"]

    def one(i, s):
        if progress is not None:
            progress(f"{model_name}: scenario {i + 1}/{len(scenarios)} {s.name}")
        return capture(config, s, layers=layers, seed=seed, scale=scale, device=device, dtype=dtype)
    run_layers = total if layers is None else min(layers, total)
    return {
        "schema_version": SCHEMA_VERSION,
        "model": model_name,
        "config_source": config.get("_source"),
        "capture": {
            "device": device, "dtype": str(dtype).replace("torch.", ""),
            "shape_only": device == "meta",
            "note": ("shape-only capture on the meta device: shapes, dtypes and strides are exact, no "
                     "arithmetic ran, tokens were drawn by a synthetic sampler (outputs run to full "
                     "length)") if device == "meta" else "computed capture",
            "num_hidden_layers": total, "layers_run": run_layers,
            "depth": (f"layers 0..{run_layers - 1} ran; layers 1..{run_layers - 1} stand for layers "
                      f"1..{total - 1} of their kind (counts multiplied)") if run_layers < total else "full depth",
            "layer_kinds": dict(sorted(Counter(layer_kinds(config)).items())),
            "counts": "calls per (phase, n): n is the leading dimension of the tensor arguments "
                      "(tokens in the step; sequences for the LM head)",
            "attention_steps": f"one row per bucket of steps; lengths kept to {SIGNIFICANT_BITS} "
                               "significant bits; decode = [sequences, context min, p25, p50, p75, "
                               "max]; prefill = [[context, query], ...] per prefilling sequence",
        },
        "scenarios": {s.name: one(i, s) for i, s in enumerate(scenarios)},
    }
