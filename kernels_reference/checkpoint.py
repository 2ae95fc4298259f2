"""Load HF-named checkpoint tensors into our modules (any level: a whole model or one block).

Names are HF's (safetensors shards or an HF ``state_dict``). Our modules pack some of them: q/k/v
into ``qkv_proj``, gate/up into ``gate_up_proj`` (LlamaMLP), and all experts of a MoE layer into
FusedMoE's ``w13_weight`` [E, 2I, H] (gate rows, then up rows) and ``w2_weight`` [E, H, I]. Experts
come either per expert, as Hub checkpoints store them (``experts.{e}.w1/w3/w2`` for Mixtral,
``experts.{e}.gate_proj/up_proj/down_proj`` for Qwen3-MoE and DeepSeek), or already stacked, as
transformers 5 keeps them in memory (``experts.gate_up_proj`` / ``experts.down_proj``, the same
layout as ours). Every parameter, and every shard of a packed one, must be delivered; shapes must
match exactly.
"""
import re
from typing import Dict, Iterable, Sequence, Set, Tuple

import torch
from torch import nn

# HF name fragment -> (our packed parameter, shard)
_STACKED = {".q_proj.": ("qkv_proj", "q"), ".k_proj.": ("qkv_proj", "k"), ".v_proj.": ("qkv_proj", "v"),
            ".gate_proj.": ("gate_up_proj", 0), ".up_proj.": ("gate_up_proj", 1)}
# One expert's matrix in a Hub checkpoint.
_EXPERT = re.compile(r"^((?:.*\.)?experts)\.(\d+)\.(w1|w3|w2|gate_proj|up_proj|down_proj)\.weight$")
_EXPERT_HALF = {"w1": 0, "gate_proj": 0, "w3": 1, "up_proj": 1}  # gate rows first, then up rows
# transformers 5: all experts of a layer in one 3-D tensor, in FusedMoE's own layout.
_FUSED_EXPERTS = re.compile(r"^((?:.*\.)?experts)\.(gate_up_proj|down_proj)$")
_FUSED_TARGET = {"gate_up_proj": "w13_weight", "down_proj": "w2_weight"}
_IGNORED = ("rotary_emb.inv_freq",)


@torch.no_grad()
def load_checkpoint(module: nn.Module, weights: Iterable[Tuple[str, torch.Tensor]],
                    renames: Sequence[Tuple[str, str]] = (), skip: Sequence[str] = ()) -> None:
    """Copy ``weights`` into ``module``. ``renames``: (checkpoint fragment, ours) applied to each
    name first; ``skip``: names neither loaded nor required (a tied LM head)."""
    params = dict(module.named_parameters(remove_duplicate=False))
    loaded: Dict[str, Set] = {}
    for name, tensor in weights:
        if name in skip or any(i in name for i in _IGNORED):
            continue
        target, index, shard = _placement(module, name, renames, params)
        if target not in params:
            raise KeyError(f"checkpoint weight {name!r} has no place in {type(module).__name__}")
        dst = params[target] if index is None else params[target][index]
        tensor = _this_ranks_part(module, target, tensor, shard)
        if dst.shape != tensor.shape:
            raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} != {tuple(dst.shape)}")
        dst.copy_(tensor)
        loaded.setdefault(target, set()).update(_shards(module, target) if shard is None else {shard})
    missing = {n for n in params if n not in skip and not _shards(module, n) <= loaded.get(n, set())}
    if missing:
        raise KeyError(f"weights missing from the checkpoint: {sorted(missing)[:8]}")


def _this_ranks_part(module: nn.Module, target: str, tensor: torch.Tensor, shard) -> torch.Tensor:
    """The part of a full checkpoint tensor this tensor-parallel rank holds: the owning layer's
    ``shard_checkpoint`` where it has one (sharded linears and embeddings), else all of it."""
    owner_name, _, leaf = target.rpartition(".")
    owner = module.get_submodule(owner_name) if owner_name else module
    cut = getattr(owner, "shard_checkpoint", None)
    return cut(leaf, tensor, shard) if callable(cut) else tensor


def _placement(module: nn.Module, name: str, renames, params=()):
    """checkpoint name -> (our parameter, index into it or None for all of it, shard or None)."""
    for old, new in renames:
        name = name.replace(old, new)
    if name in params:  # a parameter of ours by that very name (DeepSeek's unpacked ``q_proj``)
        return name, None, None
    expert = _EXPERT.match(name)
    if expert:
        prefix, e, which = expert.group(1), int(expert.group(2)), expert.group(3)
        if which in ("w2", "down_proj"):
            return f"{prefix}.w2_weight", e, e
        experts = module.get_submodule(prefix)  # this rank's share of the intermediate features
        size = getattr(experts, "intermediate_size_per_partition", experts.intermediate_size)
        half = _EXPERT_HALF[which]
        return f"{prefix}.w13_weight", (e, slice(half * size, (half + 1) * size)), (e, half)
    fused = _FUSED_EXPERTS.match(name)
    if fused:
        return f"{fused.group(1)}.{_FUSED_TARGET[fused.group(2)]}", None, None
    for fragment, (packed, shard) in _STACKED.items():
        if fragment in f".{name}":  # a block loaded alone has top-level names (``gate_proj.weight``)
            target = f".{name}".replace(fragment[1:-1], packed)[1:]
            owner = module.get_submodule(target.rsplit(".", 1)[0])
            start = owner.shard_offset(shard)
            size = owner.shard_size(shard) if packed == "qkv_proj" else owner.output_sizes[shard]
            return target, slice(start, start + size), shard
    return name, None, None


def _shards(module: nn.Module, param: str) -> Set:
    """The pieces a checkpoint may deliver ``param`` in (all needed); ``{None}``: whole only."""
    if f".{param}".endswith(".qkv_proj.weight") or f".{param}".endswith(".qkv_proj.bias"):
        return {"q", "k", "v"}
    if f".{param}".endswith((".gate_up_proj.weight", ".gate_up_proj.bias")):
        return {0, 1}
    if param.endswith((".w13_weight", ".w2_weight")):
        experts = module.get_submodule(param.rsplit(".", 1)[0]).num_experts
        if param.endswith("w13_weight"):
            return {(e, h) for e in range(experts) for h in (0, 1)}
        return set(range(experts))
    return {None}


def strip_prefixes(state: Dict[str, torch.Tensor], prefixes: Sequence[str]) -> Dict[str, torch.Tensor]:
    """``state`` with the first of ``prefixes`` each name starts with removed (a task model's
    checkpoint keeps its backbone under one, e.g. ``dinov2.`` or ``convnextv2.``)."""
    out = {}
    for name, tensor in state.items():
        for prefix in prefixes:
            if name.startswith(prefix):
                name = name[len(prefix):]
                break
        out[name] = tensor
    return out
