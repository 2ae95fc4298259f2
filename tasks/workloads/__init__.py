"""Captured workloads (``<model>.json``, made by ``tools/capture_workloads.py``) turned into task cases.

A capture file holds, per serving scenario, every reference module's calls as histograms over
(step phase, n) where n is the leading dimension of its tensor arguments (tokens in the step), and
the attention steps' batch compositions (see ``kernels_reference/engine/capture.py``).

Weights. Within a scenario a call's weight is its share of the calls of its module class; the
scenarios are mixed by ``SCENARIO_MIX`` (equal: each serving regime counts the same; a state
model's capture adds ``long-prefill`` as a fifth, ``OPTIONAL_SCENARIOS``). So for one
model and one class the weights sum to 1, and a task whose cases cover all of a class's calls has
weights summing to 1 per model (every model counts the same in the task's weighted geomean).

Representatives. A chat run has hundreds of distinct token counts; a task keeps ``k`` of them,
chosen by a weighted k-median in log2(n) (the first is the single best; the largest n is always
kept), and each other count's weight is folded into its nearest representative, so the weights
still sum to the workload. Attention batches are chosen the same way over step features (decode
sequences and context, prefill tokens and context), the heaviest step always kept among those whose
float64 truth fits (``MAX_TRUTH_PAIRS``; heavier steps fold into a representative).
"""
from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

SCHEMA_VERSION = 1
# Query-key pairs of one sequence a representative batch may have: the float64 truth of attention
# holds [heads, query, key] scores (32 heads x 2**25 pairs x 8 bytes = 8.6 GB, a few copies live).
MAX_TRUTH_PAIRS = 1 << 25
SCENARIO_MIX = {"chat": 0.25, "long-context": 0.25, "batch-1": 0.25, "batch-32": 0.25}
# Scenarios only some models serve (the state models' 64k-token prompts), weighed as much as each of
# SCENARIO_MIX's where captured; a capture's mix is renormalised to sum to 1 (``scenario_mix``).
OPTIONAL_SCENARIOS = {"long-prefill": 0.25}
_DIR = Path(__file__).parent

Group = Dict  # one capture entry: class, init, args, calls, counts


@lru_cache(maxsize=None)
def load_capture(model: str) -> Optional[Dict]:
    """The model's capture, or None when it has none."""
    path = _DIR / f"{model}.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    if data.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"{path}: schema_version {data.get('schema_version')}, this loader reads {SCHEMA_VERSION}")
    missing = set(SCENARIO_MIX) - set(data["scenarios"])
    if missing:
        raise ValueError(f"{path}: scenarios {sorted(missing)} missing (SCENARIO_MIX weighs them)")
    return data


def scenario_mix(data: Dict) -> Dict[str, float]:
    """The scenario weights of one capture: SCENARIO_MIX's and the optional ones it has, summing to 1."""
    mix = dict(SCENARIO_MIX, **{k: v for k, v in OPTIONAL_SCENARIOS.items() if k in data["scenarios"]})
    total = sum(mix.values())
    return {k: v / total for k, v in mix.items()}


def captured_models() -> List[str]:
    return sorted(p.stem for p in _DIR.glob("*.json"))


# ---- token counts (dense, norm, activation, rope tasks) -------------------------------------------
def token_histogram(model: str, cls: str, select: Callable[[Group], bool] = lambda g: True
                    ) -> Dict[Tuple[str, int], float]:
    """Weight of each (phase, n) among the calls of ``cls`` that ``select`` keeps (see module doc)."""
    data = load_capture(model)
    if data is None:
        raise KeyError(f"no captured workload for {model!r}; captured: {', '.join(captured_models())}")
    hist: Dict[Tuple[str, int], float] = {}
    for name, mix in scenario_mix(data).items():
        groups = [g for g in data["scenarios"][name]["modules"] if g["class"] == cls]
        total = sum(g["calls"] for g in groups)
        if not total:
            continue
        for g in filter(select, groups):
            for phase, counts in g["counts"].items():
                for n, c in counts.items():
                    key = (phase, int(n))
                    hist[key] = hist.get(key, 0.0) + mix * c / total
    return hist


def weighted_k_median(points: Sequence[Sequence[float]], weights: Sequence[float], k: int,
                      forced: Sequence[int] = (), candidates: int = 512,
                      eligible: Optional[Sequence[bool]] = None) -> List[int]:
    """Indices of up to ``k`` representatives under the L1 distance: greedy, each pick cutting the
    weighted distance of all points to their nearest pick the most (``forced`` picks come first).
    Candidates are the ``candidates`` heaviest ``eligible`` points (and the forced ones)."""
    x = np.asarray(points, dtype=float).reshape(len(points), -1)
    w = np.asarray(weights, dtype=float)
    ok = np.ones(len(x), bool) if eligible is None else np.asarray(eligible, bool)
    order = [i for i in np.argsort(-w, kind="stable").tolist() if ok[i]]
    cand = sorted(set(order[:candidates]) | set(forced))
    k = min(k, len(cand))
    dist = np.abs(x[:, None, :] - x[None, cand, :]).sum(-1)  # [points, candidates]
    chosen = list(dict.fromkeys(forced))
    nearest = dist[:, [cand.index(c) for c in chosen]].min(1) if chosen else np.full(len(x), np.inf)
    while len(chosen) < k:
        cost = np.where(np.isinf(nearest)[:, None], dist, np.minimum(nearest[:, None], dist)).T @ w
        cost[[cand.index(c) for c in chosen]] = np.inf
        best = int(np.argmin(cost))  # first minimum: deterministic
        chosen.append(cand[best])
        nearest = np.minimum(nearest, dist[:, best])
    return chosen


def fold(points: Sequence[Sequence[float]], weights: Sequence[float], reps: Sequence[int]) -> List[float]:
    """Each point's weight added to its nearest representative (L1; ties: the earlier pick)."""
    x = np.asarray(points, dtype=float).reshape(len(points), -1)
    dist = np.abs(x[:, None, :] - x[None, list(reps), :]).sum(-1)
    out = np.zeros(len(reps))
    np.add.at(out, dist.argmin(1), np.asarray(weights, dtype=float))
    return out.tolist()


def token_representatives(hist: Dict[Tuple[str, int], float], k: int) -> List[Tuple[str, int, float]]:
    """(phase, n, weight) for ``k`` representative token counts; weights fold in the others'.

    Phases are merged first (a kernel sees n tokens, whatever step they came from); a representative
    is labelled with the phase that contributes most of its own count.
    """
    by_n: Dict[int, float] = {}
    phase_of: Dict[int, Tuple[float, str]] = {}
    for (phase, n), w in hist.items():
        by_n[n] = by_n.get(n, 0.0) + w
        phase_of[n] = max(phase_of.get(n, (0.0, "")), (w, phase))
    ns = sorted(by_n)
    if not ns:
        return []
    weights, logs = [by_n[n] for n in ns], [math.log2(n) for n in ns]
    reps = weighted_k_median(logs, weights, k, forced=[len(ns) - 1])
    folded = fold(logs, weights, reps)
    return sorted(((phase_of[ns[r]][1], ns[r], w) for r, w in zip(reps, folded)), key=lambda x: x[1])


# ---- attention batches (attention, L2 attention block, L3 layer) ------------------------------------
def _interpolate(quantiles: Sequence[int], count: int) -> List[int]:
    """``count`` context lengths spread through the five recorded quantiles (min, p25, p50, p75, max)."""
    if count == 1:
        return [int(quantiles[2])]
    out = []
    for i in range(count):
        f = 4 * i / (count - 1)
        lo = min(int(f), 3)
        out.append(int(round(quantiles[lo] + (f - lo) * (quantiles[lo + 1] - quantiles[lo]))))
    return out


def step_batch(step: Dict) -> Tuple[List[int], List[int]]:
    """(context lens, query lens) of a recorded step: its decodes first, then its prefill chunks."""
    ctx, q = [], []
    if step["decode"]:
        n, quants = step["decode"][0], step["decode"][1:]
        ctx += _interpolate(quants, n)
        q += [1] * n
    for c, n in step["prefill"]:
        ctx.append(c)
        q.append(n)
    return ctx, q


def _features(batch: Tuple[List[int], List[int]]) -> Tuple[float, ...]:
    ctx, q = batch
    dec = [c for c, n in zip(ctx, q) if n == 1]
    pre = [(c, n) for c, n in zip(ctx, q) if n > 1]
    return (math.log2(1 + len(dec)), math.log2(1 + sum(dec)),
            math.log2(1 + sum(n for _, n in pre)), math.log2(1 + sum(c for c, _ in pre)))


def _work(batch) -> float:
    """Attention work of a step (query-key pairs), to always keep the heaviest one."""
    return sum(n * (c + (n + 1) / 2) for c, n in zip(*batch))


def layer_kind_shares(model: str) -> Optional[Dict[str, float]]:
    """Each layer kind's share of the model's layers as its capture records them (a hybrid's
    ``layer_types``: Qwen3-Next's 36 linear-attention and 12 full-attention layers give 0.75 and
    0.25), or None without a capture or without kinds."""
    data = load_capture(model)
    kinds = (data or {}).get("capture", {}).get("layer_kinds")
    if not kinds:
        return None
    total = sum(kinds.values())
    return {kind: n / total for kind, n in kinds.items()}


@lru_cache(maxsize=None)
def batch_representatives(model: str, k: int) -> List[Tuple[str, List[int], List[int], float]]:
    """(phase, context lens, query lens, weight) for ``k`` representative attention steps."""
    data = load_capture(model)
    if data is None:
        raise KeyError(f"no captured workload for {model!r}")
    batches, weights = [], []
    for name, mix in scenario_mix(data).items():
        steps = data["scenarios"][name]["attention_steps"]
        total = sum(s["count"] for s in steps)
        for s in steps:
            batches.append(step_batch(s))
            weights.append(mix * s["count"] / total)
    feats = [_features(b) for b in batches]
    # The float64 truth materialises each sequence's scores: a step beyond the budget is folded
    # into a representative, never one itself.
    eligible = [max(n * (c + n) for c, n in zip(*b)) <= MAX_TRUTH_PAIRS for b in batches]
    heaviest = max((i for i in range(len(batches)) if eligible[i]), key=lambda i: _work(batches[i]))
    reps = weighted_k_median(feats, weights, k, forced=[heaviest], eligible=eligible)
    folded = fold(feats, weights, reps)
    out = []
    for r, w in zip(reps, folded):
        ctx, q = batches[r]
        phase = "decode" if all(n == 1 for n in q) else "prefill" if all(n > 1 for n in q) else "mixed"
        out.append((phase, ctx, q, w))
    return sorted(out, key=lambda x: (x[0], sum(x[2]), sum(x[1])))


def batch_name(phase: str, ctx: Sequence[int], q: Sequence[int]) -> str:
    """Readable id part: sequences, query tokens (unless decode), median context."""
    median = sorted(ctx)[len(ctx) // 2]
    query = "" if phase == "decode" else f"-Q{sum(q)}"
    return f"{phase}-B{len(q)}{query}-C{median}"


# ---- state kernels' calls (scans, recurrent updates, short convolutions) ----------------------------
def _state_calls(model: str, phases: Sequence[str]) -> Dict[Tuple[str, Tuple[int, ...], Tuple[bool, ...]], float]:
    """Weight of each (phase, lengths, carried) call of a state kernel over the captured steps.

    A step's state layer runs its prefill chunks in one chunked-kernel call (lengths = the chunks'
    query tokens; carried = whether the sequence has context, i.e. an initial state) and its decodes
    in one recurrent call, as vLLM's Mamba-2 and gated DeltaNet layers split a batch. Each call's
    weight is its share of the calls of ``phases`` within its scenario, the scenarios mixed by
    :func:`scenario_mix` and the total renormalised to 1."""
    data = load_capture(model)
    if data is None:
        raise KeyError(f"no captured workload for {model!r}; captured: {', '.join(captured_models())}")
    out: Dict = {}
    for name, mix in scenario_mix(data).items():
        calls = []
        for step in data["scenarios"][name]["attention_steps"]:
            ctx, q = step_batch(step)
            # a one-token prompt has no state to update: it is a (fresh) prefill of one token
            parts = {"prefill": [(c, n) for c, n in zip(ctx, q) if n > 1 or c == 0],
                     "decode": [(c, n) for c, n in zip(ctx, q) if n == 1 and c > 0]}
            for phase in phases:
                if parts[phase]:
                    key = (phase, tuple(n for _, n in parts[phase]), tuple(c > 0 for c, _ in parts[phase]))
                    calls.append((key, step["count"]))
        total = sum(c for _, c in calls)
        for key, c in calls:
            out[key] = out.get(key, 0.0) + mix * c / total
    if not out:
        raise KeyError(f"{model}'s capture has no {' or '.join(phases)} step")
    norm = sum(out.values())
    return {k: v / norm for k, v in out.items()}


def _state_features(key) -> Tuple[float, ...]:
    _, lengths, carried = key
    return (math.log2(1 + sum(lengths)), math.log2(1 + len(lengths)), math.log2(1 + max(lengths)),
            sum(carried) / len(carried))


@lru_cache(maxsize=None)
def state_call_representatives(model: str, phases: Tuple[str, ...], k: int
                               ) -> List[Tuple[str, Tuple[int, ...], Tuple[bool, ...], float]]:
    """(phase, lengths, carried per sequence, weight) for up to ``k`` representative calls per phase
    of a state kernel (``phases``: what the task's kernel runs, prefill and/or decode), each other
    call's weight folded into the nearest representative of its phase (features: total tokens,
    sequences and longest sequence in log2, and the share of sequences carrying a state). The
    heaviest call of each phase is always kept. Weights sum to 1 over all phases."""
    calls = _state_calls(model, phases)
    out = []
    for phase in phases:
        keys = sorted(key for key in calls if key[0] == phase)
        if not keys:
            continue
        weights = [calls[key] for key in keys]
        feats = [_state_features(key) for key in keys]
        heaviest = max(range(len(keys)), key=lambda i: (sum(keys[i][1]), i))
        reps = weighted_k_median(feats, weights, k, forced=[heaviest])
        out += [(*keys[r], w) for r, w in zip(reps, fold(feats, weights, reps))]
    return sorted(out, key=lambda x: (x[0], sum(x[1]), len(x[1])))
