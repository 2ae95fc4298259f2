"""Running one end-to-end case inside the evaluator (the rules are :mod:`fk_pytest.e2e`).

Per model, once (:class:`ModelCalibration`, cached by the evaluator): build the reference, and for
every scenario of the model generate the target sequences, run the noise runs and the built-in
mutants. Per case: compose the candidate, teacher-force it on the scenario's sequences, judge it
against the model's pooled noise floor, and (on a GPU) time it against the reference.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from . import status
from .build import copy_model, own_parameters, release_memory, with_paths, with_rounding
from .compose import Composition, swap_children
from .e2e import (DECODE, DECODE_PATH, FAIL_AT, MIN_STABLE_TOKENS, PATHS, PREFILL, VALID_CREDIT, E2EResult, E2ESpec,
                  MutantResult, Predictions, Request, as_mutant, blend, catch_at, credit, noise_floor,
                  noise_tallies, note_blindness, sampling_allowance, stable_positions, tally)
from .e2e_tp import candidate_at_degree
from .errors import CandidateError, short_traceback
from .task import degree_one_id, tp_degree

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


# ---- the engine's view of any model tree -------------------------------------------------------
class EngineModel(torch.nn.Module):
    """What the engine needs (``forward``, ``compute_logits``, ``allocate_kv_cache``) around a
    model whose contract is only the L4 ``forward(input_ids, positions)``: a candidate L4 class
    need not reimplement the serving plumbing. KV caches go to every module exposing ``kv_cache``
    (the attention contract), so a candidate attention is fed exactly like the reference's."""

    def __init__(self, root: torch.nn.Module, reference: torch.nn.Module):
        super().__init__()
        self.root = root
        self.config = reference.config  # the engine reads max_position_embeddings and vocab_size
        # One layer's cache in the reference's layout (a key/value pair, or MLA's one latent
        # tensor): a composed tree has the reference's modules, so its layers take the same.
        self._new_cache = getattr(reference, "new_cache", None)

    def forward(self, input_ids, positions):
        return self.root(input_ids, positions)

    def compute_logits(self, hidden_states):
        own = getattr(self.root, "compute_logits", None)
        return own(hidden_states) if callable(own) else self.root.lm_head(hidden_states)

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> None:
        param = next(self.root.parameters())
        layers = [m for m in self.root.modules() if hasattr(m, "kv_cache")]
        if not layers:
            raise RuntimeError("no module of the model exposes a kv_cache attribute (attention contract)")
        for m in layers:  # each layer's own KV heads: this rank's under tensor parallelism
            m.kv_cache = self._cache(num_blocks, block_size, param.dtype, param.device, getattr(m, "num_kv_heads", None))

    def _cache(self, num_blocks, block_size, dtype, device, kv_heads=None):
        if self._new_cache is not None:
            return self._new_cache(num_blocks, block_size, dtype, device, kv_heads)
        shape = (num_blocks, block_size, kv_heads or self.config.num_key_value_heads, self.config.head_dim)
        return torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)


class StateEngineModel(EngineModel):
    """:class:`EngineModel` of a model with state layers (Mamba-2, Qwen3-Next): the engine's state
    slot pools go to every module exposing ``state_cache`` (the state layers' contract), in the
    reference's per-slot shapes (conv window in the model's dtype, recurrent state in float32);
    a model without attention (Mamba-2) has no KV cache to allocate."""

    def __init__(self, root: torch.nn.Module, reference: torch.nn.Module):
        super().__init__(root, reference)
        self._state_shapes = reference.state_shapes()

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> None:
        if any(hasattr(m, "kv_cache") for m in self.root.modules()):
            super().allocate_kv_cache(num_blocks, block_size)

    def allocate_state_pools(self, num_slots: int, dtype=None, device=None):
        param = next(self.root.parameters())
        dtype, device = dtype or param.dtype, device or param.device
        from kernels_reference.state_pools import bind_state_pools
        layers = [m for m in self.root.modules() if hasattr(m, "state_cache")]
        if not layers:
            raise RuntimeError("no module of the model exposes a state_cache attribute (state layer contract)")
        return bind_state_pools(layers, num_slots, *self._state_shapes, dtype, device)


def unbind_kv_caches(model: torch.nn.Module) -> None:
    """Drop the KV caches the last engine bound to ``model``'s layers. The engine binds them to the
    modules it serves and nothing unbinds them when it goes: a reference kept for later runs would
    hold its last engine's cache (GBs at full size) while the next engine allocates its own."""
    for m in model.modules():
        if getattr(m, "kv_cache", None) is not None:
            m.kv_cache = None
        if getattr(m, "state_cache", None) is not None:  # state layers' slot pools, likewise
            m.state_cache = None


def engine_model(model: torch.nn.Module, reference: torch.nn.Module) -> EngineModel:
    """``model`` (the reference, a mutant or a composed candidate) as the engine serves it, with the
    reference's config and cache layout."""
    wrapper = StateEngineModel if hasattr(reference, "allocate_state_pools") else EngineModel
    return wrapper(model, reference)


def _engine(model: torch.nn.Module, reference: torch.nn.Module, args: dict):
    from kernels_reference.engine import LLM
    return LLM(engine_model(model, reference), **args)


def _params(requests: Sequence[Request]):
    from kernels_reference.engine import SamplingParams
    return [SamplingParams(max_tokens=n) for _, n in requests]


def forced(llm, run: "ScenarioRun", path: str) -> Predictions:
    """Per request, ``llm``'s top-1 at each of the run's target positions, scored on ``path``
    (``PREFILL``: teacher-forced through prefill; ``DECODE``: one decode step per target token)."""
    score = llm.score if path == PREFILL else llm.score_decode
    return [list(map(int, p)) for p in score(run.sequences, run.prompt_lens)]


def forced_counting_steps(llm, run: "ScenarioRun", path: str) -> Tuple[Predictions, Dict[str, int]]:
    """``forced`` on ``path``, and the engine steps of each kind that scoring took."""
    before = dict(llm.runner.steps)
    predictions = forced(llm, run, path)
    return predictions, {k: n - before.get(k, 0) for k, n in llm.runner.steps.items() if n - before.get(k, 0)}


def both_paths(llm, run: "ScenarioRun", prefix: str = "") -> Dict[str, Predictions]:
    """``{prefix + path: predictions}`` for both scoring paths, on one engine."""
    return {prefix + path: forced(llm, run, path) for path in PATHS}


def mutant_predictions(llm, run: "ScenarioRun", kind: str) -> Dict[str, Predictions]:
    """A mutant's predictions per path; the second path is skipped when the first already took all
    credit (d >= FAIL_AT whatever the floor): it cannot undo a catch. A decode-path mutant (wrong on
    decode steps only) is scored decode-forced first; every other kind prefill-forced first, the
    cheaper path (one pass over prompts and targets, where decode-forced prefills the same prompts
    and then takes one step per target: 0.3 s against 2.6 s per SmolLM2 scenario on 2 CPU cores on
    2026-12-06), and a bug that is wrong everywhere is caught there as well."""
    out, stable = {}, run.stable()
    for path in ((DECODE, PREFILL) if kind == DECODE_PATH else (PREFILL, DECODE)):
        out[path] = forced(llm, run, path)
        if tally(out[path], run.expected, stable).d >= FAIL_AT:
            break
    return out


def compose_candidate(reference: torch.nn.Module, lookup, share_parameters: bool = False
                      ) -> Tuple[torch.nn.Module, Composition]:
    """A copy of the reference with every class ``lookup`` provides swapped in (the L4 class itself
    included), weights loaded strictly from the reference's; what failed is in the composition.
    ``share_parameters`` (built-in mutants only, see ``copy_model``): the modules left as they are
    hold the reference's own weights; otherwise they get their own copies once the swapped classes
    are built.

    Composed on a copy that shares the reference's weights, then those left shared are copied: a
    swapped class loads straight from the reference, so no module's weights exist three times. A
    tree providing the model class itself (the reference tree does) used to need a full copy, the
    new model and the reference at once; on an 80 GB H100 on 2026-12-07 Qwen3-30B-A3B's 24-layer cut
    did not fit that (docs/perf/h100-2026-12-07.md)."""
    holder = torch.nn.Module()
    holder.model = copy_model(reference, share_parameters=True)
    composition = swap_children(holder, lookup, source_shared=True) if lookup is not None else Composition()
    if not share_parameters:
        own_parameters(holder.model, reference)
    if any(p.is_cuda for p in holder.model.parameters()):
        release_memory()  # what the constructors cast and dropped stays in torch's cache otherwise
    return holder.model, composition


def composed_or_verdict(result: E2EResult, reference: torch.nn.Module, lookup, has_candidate: bool,
                        cache: Optional["CalibrationCache"] = None) -> Optional[torch.nn.Module]:
    """The composed candidate model, or None with ``result``'s verdict set: a class of the tree
    that fails to compose (its status), or a tree none of whose classes the model uses. A class
    whose loading code wrote the reference's weights (TAMPERED) also drops the reference from
    ``cache``: the next case builds it again."""
    candidate, composition = compose_candidate(reference, lookup)
    if composition.reference_written and cache is not None:
        cache.forget()
    result.swapped, result.failed_classes = list(composition.swapped), dict(composition.failed)
    try:
        composition.raise_if_failed()
    except CandidateError as exc:
        result.status, result.message = exc.status, exc.message
        return None
    if has_candidate and not result.swapped:
        result.status = status.NOT_ATTEMPTED
        result.message = "no module of the candidate tree is used inside the model"
        return None
    return candidate


# ---- per model: targets, noise and mutants of every scenario -----------------------------------
@dataclasses.dataclass
class ScenarioRun:
    """What the reference gives one scenario: targets, and the noise runs' and mutants' top-1."""

    case_id: str
    requests: List[Request]
    sequences: List[List[int]]
    prompt_lens: List[int]
    noise: Dict[str, Predictions]  # "run/path" -> per-request top-1
    # name -> (kind, {path: top-1} or None when the model has no module it replaces, classes swapped)
    mutants: Dict[str, Tuple[str, Optional[Dict[str, Predictions]], List[str]]]
    expected: List[List[int]] = dataclasses.field(default_factory=list)  # the reference's decode-forced top-1

    def stable(self, extra: Optional[Dict[str, Predictions]] = None) -> List[List[bool]]:
        """The positions every noise run (and ``extra``'s) predicts as the reference does."""
        return stable_positions({**self.noise, **(extra or {})}, self.expected)


@dataclasses.dataclass
class ModelCalibration:
    """One model's reference and (once asked for) every scenario's targets, noise and mutants."""

    key: tuple
    reference: torch.nn.Module
    scenarios: Optional[Dict[str, ScenarioRun]] = None



def _calibration_key(spec: E2ESpec, case) -> tuple:
    return (spec.name,) + tuple((c.id, repr(sorted(c.params.items()))) for c in spec.model_cases(case))


def memory_note(device: torch.device) -> str:
    """What a progress line adds on a GPU: the memory in use, where a full-size run meets its limit."""
    if device.type != "cuda":
        return ""
    return f", {torch.cuda.memory_allocated(device) / 2 ** 30:.1f} GiB in use"


def calibrate(spec: E2ESpec, case, reference: torch.nn.Module, device: torch.device,
              progress: Progress) -> Dict[str, ScenarioRun]:
    """For each scenario of ``case``'s model: the reference's greedy targets, its noise runs
    (re-scored as-is, re-batched, on CUDA its plain-PyTorch definition, and where the spec asks
    every kernel's outputs rounded anew) and each built-in
    mutant's discrepancy. Nothing here depends on the candidate."""
    scenarios = {}
    for sc in spec.model_cases(case):
        requests = spec.requests(sc)
        args, rebatched = _engine_args(spec, sc, device)
        prompts = [list(p) for p, _ in requests]
        continuations = spec.continuations(sc)
        progress(f"{sc.id}: reference, decode-forced on {len(requests)} requests' "
                 f"{'own greedy output' if continuations is None else 'given continuations'}, "
                 f"{sum(n for _, n in requests)} tokens{memory_note(device)}")
        engine = _engine(reference, reference, args)
        if continuations is None:  # its own greedy output, which decode-forced scoring replays
            outputs = engine.generate(prompts, _params(requests))
            run = ScenarioRun(sc.id, requests, [p + list(o) for p, o in zip(prompts, outputs)],
                              [len(p) for p in prompts], {}, {}, [list(o) for o in outputs])
        else:
            run = ScenarioRun(sc.id, requests, [p + list(c) for p, c in zip(prompts, continuations)],
                              [len(p) for p in prompts], {}, {})
            run.expected = [list(map(int, e)) for e in engine.score_decode(run.sequences, run.prompt_lens)]
        progress(f"{sc.id}: noise runs on both paths (same engine, re-batched"
                 f"{', plain PyTorch' if device.type == 'cuda' else ''}"
                 f"{', rounded anew' if spec.rounding_noise(sc) else ''}){memory_note(device)}")
        # Prefill-forced only: decode-forced on this engine is what ``expected`` is (d = 0 by
        # construction; for greedy output the engine's tests check that it replays generate).
        run.noise["teacher-forced/" + PREFILL] = forced(engine, run, PREFILL)
        del engine
        order = list(reversed(range(len(run.sequences))))
        shuffled = ScenarioRun(sc.id, [requests[i] for i in order], [run.sequences[i] for i in order],
                               [run.prompt_lens[i] for i in order], {}, {}, [run.expected[i] for i in order])
        for key, p in both_paths(_engine(reference, reference, rebatched), shuffled, "rebatched/").items():
            run.noise[key] = [p[order.index(i)] for i in range(len(order))]
        if device.type == "cuda":
            # Two correct implementations of one model differ by their rounding: the reference's
            # plain-PyTorch definition (eager decode, no graphs) is the second.
            native = with_paths(reference, "forward_native", share_parameters=True)
            run.noise.update(both_paths(_engine(native, reference, dict(args, cuda_graphs=False)), run,
                                        "reference-native/"))
            del native
            release_memory()
        if spec.rounding_noise(sc):  # every kernel's outputs rounded anew (see with_rounding)
            rounded = with_rounding(reference, seed=len(run.sequences), share_parameters=True)
            run.noise.update(both_paths(_engine(rounded, reference, dict(args, cuda_graphs=False)), run,
                                        "reference-rounded/"))
            del rounded
            release_memory()
        for name, entry in spec.mutants(sc).items():
            mutant_spec = as_mutant(entry)
            progress(f"{sc.id}: built-in mutant {name} ({mutant_spec.kind}{memory_note(device)})")
            mutant, composition = compose_candidate(reference, mutant_spec.classes.get, share_parameters=True)
            if not composition.swapped:
                run.mutants[name] = (mutant_spec.kind, None, [])
                continue
            run.mutants[name] = (mutant_spec.kind, mutant_predictions(_engine(mutant, reference, args), run,
                                                                      mutant_spec.kind),
                                 composition.swapped)
            del mutant
            release_memory()
        scenarios[sc.id] = run
        unbind_kv_caches(reference)
        release_memory()
    return scenarios


def _engine_args(spec: E2ESpec, case, device: torch.device) -> Tuple[dict, dict]:
    args, rebatched = spec.engine_args(case), spec.rebatched_engine_args(case)
    if device.type == "cuda" and spec.cuda_graphs:  # production decodes in CUDA graphs
        args, rebatched = dict(args, cuda_graphs=True), dict(rebatched, cuda_graphs=True)
    return args, rebatched


def _as_json(run: ScenarioRun) -> dict:
    return dataclasses.asdict(run)


def _from_json(data: dict) -> ScenarioRun:
    run = ScenarioRun(**data)
    run.requests = [(list(p), int(n)) for p, n in run.requests]
    run.mutants = {name: (kind, preds, list(swapped)) for name, (kind, preds, swapped) in run.mutants.items()}
    return run


class CalibrationCache:
    """One model's calibration at a time (a GPU holds one 8B reference, not four); with
    ``directory`` (``--fk-cache-dir``) also kept on disk for the next run (:mod:`fk_pytest.e2e_cache`)."""

    def __init__(self, directory=None, progress: Progress = _quiet):
        from .e2e_cache import DiskCalibrations, cache_dir
        directory = directory if directory is not None else cache_dir()
        self.disk = DiskCalibrations(directory, progress) if directory else None
        self.current: Optional[ModelCalibration] = None

    def forget(self) -> None:
        """Drop the model held (its weights can no longer be trusted)."""
        self.current = None
        release_memory()

    def model(self, spec: E2ESpec, case, device: torch.device) -> ModelCalibration:
        key = _calibration_key(spec, case)
        if self.current is None or self.current.key != key:
            self.current = None  # free the previous model first
            release_memory()
            self.current = ModelCalibration(key, spec.build_reference(case, device))
        # Handed out without the cache the last engine bound to it (a previous case's timing engine).
        unbind_kv_caches(self.current.reference)
        return self.current

    def scenarios(self, spec: E2ESpec, case, device: torch.device, progress: Progress) -> ModelCalibration:
        calibration = self.model(spec, case, device)
        if calibration.scenarios is None:
            key = stored = None
            if self.disk is not None:
                from .e2e_cache import fingerprint
                key = fingerprint(spec, case, calibration.reference, device)
                stored = self.disk.load(key)
            if stored is not None:
                calibration.scenarios = {sid: _from_json(run) for sid, run in stored.items()}
            else:
                calibration.scenarios = calibrate(spec, case, calibration.reference, device, progress)
                if key is not None:
                    self.disk.store(key, {sid: _as_json(run) for sid, run in calibration.scenarios.items()})
        return calibration


# ---- one case -----------------------------------------------------------------------------------
def run_e2e(spec: E2ESpec, case, device, lookup, has_candidate: bool,
            cache: Optional[CalibrationCache] = None, progress: Progress = _quiet) -> E2EResult:
    """Score one e2e case. ``lookup`` maps reference classes to the tree's (None: no tree)."""
    from .correctness import interpreted_launches
    from .guards import tampered

    started = time.perf_counter()
    device = torch.device(device)
    release_memory()  # the previous case's candidate model and engines
    result = E2EResult(case.id, spec.name, spec.family, case["model"], case["scenario"])
    why = spec.unavailable(case)
    if why:
        result.message = why
        return result
    if tp_degree(case) > 1 and device.type != "cpu":
        result.message = (f"not run: {case.id} serves the model on {tp_degree(case)} ranks, which run on the CPU "
                          "over gloo only (one GPU per rank over NCCL is not wired)")
        return result
    requests = spec.requests(case)
    result.requests, result.output_tokens = len(requests), sum(n for _, n in requests)
    if result.output_tokens < spec.min_compared_tokens:
        result.status = status.TASK_ERROR
        result.message = (f"only {result.output_tokens} compared tokens (minimum {spec.min_compared_tokens}): "
                          "too few to tell a flipped token from noise")
        return result

    cache = cache or CalibrationCache()
    reference = cache.model(spec, case, device).reference
    args, _ = _engine_args(spec, case, device)

    # Composed first: a tree that fails to compose, or touches nothing in the model, costs no run.
    candidate = composed_or_verdict(result, reference, lookup, has_candidate, cache)
    if candidate is None:
        return result

    calibration = cache.scenarios(spec, case, device, progress)
    tp, scenario_id = tp_degree(case), degree_one_id(case)  # a case at TP > 1 is judged on degree 1's calibration
    run = calibration.scenarios[scenario_id]
    at = f" at tensor-parallel degree {tp}" if tp > 1 else ""
    progress(f"{case.id}: candidate, prefill-forced and decode-forced{at} ({', '.join(result.swapped)})"
             f"{memory_note(device)}")
    candidate_top1, steps, path, cand_llm = {}, {}, "engine start-up", None
    try:
        if tp > 1:  # the engine on tp rank processes (fk_pytest.e2e_tp)
            tree = str(lookup.source.path) if lookup is not None else None
            out = candidate_at_degree(spec, case, reference, tree, run, args)
            candidate_top1, steps = out["top1"], out["steps"]
            launches = {"n": len(out["interpreted_classes"]), "by_class": dict.fromkeys(out["interpreted_classes"], 1)}
        else:
            with interpreted_launches(candidate) as launches:
                cand_llm = _engine(candidate, reference, args)  # CUDA graphs are captured here
                for path in PATHS:
                    candidate_top1[path], steps[path] = forced_counting_steps(cand_llm, run, path)
    except CandidateError as exc:  # a call into a candidate class that cannot bind
        result.status, result.message = exc.status, exc.message
        return result
    except Exception as exc:
        result.status = status.RUNTIME_ERROR
        where = "".join(f"; {note}" for note in getattr(exc, "__notes__", ()))  # the engine's step and batch
        result.message = f"the candidate model failed in the engine ({path}): {short_traceback(exc)}{where}"
        return result
    names = tampered()
    if names:
        result.status, result.message = status.TAMPERED, f"candidate code replaced {', '.join(names[:5])}"
        return result
    result.interpreted = bool(launches["n"])
    result.interpreted_classes = interpreted_classes = sorted(launches["by_class"])

    result.pooled_over = list(calibration.scenarios)
    extra = {}  # noise runs of this case only
    if result.interpreted and next(reference.parameters()).dtype == torch.bfloat16:
        # The interpreter truncates bf16: the reference's own Triton path, interpreted, is the
        # noise such a candidate must be allowed (see fk_pytest.compare).
        # The classes whose candidate modules launched interpreted kernels run their reference
        # Triton path, interpreted, as in the candidate's run; the rest stay native.
        progress(f"{case.id}: reference's own Triton path for {', '.join(interpreted_classes)}, interpreted")
        triton_ref = with_paths(reference, "forward_triton", interpreted_classes)
        extra = both_paths(_engine(triton_ref, reference, args), run, "reference-triton-interpreted/")
        del triton_ref
        release_memory()
    _judge(result, calibration.scenarios, scenario_id, candidate_top1, steps, extra)
    note_blindness(spec, case, result)

    # Timed at degree 1 only: at TP the ranks need a GPU each, and the engines are timed in-process.
    if device.type == "cuda" and cand_llm is not None and result.status not in (status.TASK_ERROR,):
        progress(f"{case.id}: timing candidate and reference engines{memory_note(device)}")
        try:
            _measure(result, cand_llm, _engine(reference, reference, args), requests, device, spec.timing_rounds)
        except Exception as exc:
            result.status = status.RUNTIME_ERROR
            result.message = f"the candidate model failed while timed: {type(exc).__name__}: {exc}"
    result.seconds = time.perf_counter() - started
    return result


def _credit(d: float, floor: float) -> float:
    """Credit against ``floor`` (g + allowance); none when the floor itself reaches FAIL_AT."""
    return credit(d, floor) if floor < FAIL_AT else 0.0


def _judge(result: E2EResult, scenarios: Dict[str, ScenarioRun], case_id: str,
           candidate: Dict[str, Predictions], steps: Optional[Dict[str, Dict[str, int]]] = None,
           extra_noise: Optional[Dict[str, Predictions]] = None) -> None:
    """Per path, credit against that path's pooled floor; the case's credit is the lower one. The
    mutants, scored the same way, decide whether the case can count at all. Every run is scored
    on the positions the reference's own noise runs keep stable (``stable_positions``)."""
    run = scenarios[case_id]
    noise_sets = {sid: (sc.expected, dict(sc.noise, **(extra_noise or {})) if sid == case_id else sc.noise)
                  for sid, sc in scenarios.items()}
    tallies = noise_tallies(noise_sets)
    result.noise = {k: t.per_request for k, t in tallies.items()}
    result.noise_compared = {k: t.compared_per_request for k, t in tallies.items()}
    stable = run.stable(extra_noise)
    result.compared_tokens = sum(map(sum, stable))
    floors = {}
    for path in PATHS:
        g, g_run = noise_floor(tallies, path)
        allowance = sampling_allowance(g, result.compared_tokens)
        scored = tally(candidate[path], run.expected, stable)
        floors[path] = g + allowance
        result.paths[path] = {"d": scored.d, "g": g, "g_run": g_run, "allowance": allowance,
                              "credit": _credit(scored.d, floors[path]), "d_requests": scored.per_request,
                              "steps": dict((steps or {}).get(path, {}))}
    # The deciding path: the lower credit; on a tie the one further above its floor.
    result.path = min(PATHS, key=lambda p: (result.paths[p]["credit"], -(result.paths[p]["d"] - floors[p])))
    decided = result.paths[result.path]
    result.d, result.g, result.allowance = decided["d"], decided["g"], decided["allowance"]
    result.credit, result.d_requests = decided["credit"], list(decided["d_requests"])

    for name, (kind, predictions, swapped) in run.mutants.items():
        ds = None if predictions is None else {p: tally(top1, run.expected, stable).d for p, top1 in predictions.items()}
        result.mutants[name] = score_mutant(kind, ds, floors, swapped)
    decide(result, floors)


def score_mutant(kind: str, ds: Optional[Dict[str, float]], floors: Dict[str, float],
                 swapped: List[str]) -> MutantResult:
    """A built-in mutant's result from its discrepancy per path (None: the model has no module it
    replaces), judged on its worst path like a candidate."""
    if ds is None:
        return MutantResult(note="the model has no module this mutant replaces", kind=kind)
    credits = {p: _credit(ds[p], floors[p]) for p in ds}
    worst = min(ds, key=lambda p: (credits[p], -ds[p]))
    return MutantResult(ds[worst], credits[worst], swapped, kind=kind, paths=dict(ds),
                        catch_at=catch_at(kind, floors[worst]))


def _small(x: float) -> str:
    """Three decimals, or three digits where that would read 0.000 (a cosine discrepancy of 1e-7)."""
    return f"{x:.3f}" if x == 0 or abs(x) >= 1e-3 else f"{x:.2e}"


def decide(result: E2EResult, floors: Dict[str, float]) -> None:
    """The case's status from its scored paths (``result.paths``, each with d, g, allowance and
    credit), their floors (g + allowance), the stable compared count and the mutants: a task error
    when the scenario cannot resolve a bug (too few stable positions, a floor at FAIL_AT),
    INSENSITIVE when a built-in mutant keeps credit, else passed or wrong by the credit."""
    unit = result.unit
    blind = [f"{n} ({m.kind}, d={m.d:.3f}, credit {m.credit:.2f})" for n, m in result.mutants.items()
             if m.d is not None and not m.caught]
    verdict = "; ".join(
        f"{p} d={_small(r['d'])} vs g={_small(r['g'])} (+{_small(r['allowance'])} at {result.compared_tokens} {unit}), "
        f"credit {r['credit']:.2f}" for p, r in result.paths.items())
    high = [p for p in result.paths if floors[p] >= FAIL_AT]
    if result.compared_tokens < MIN_STABLE_TOKENS:
        result.status = status.TASK_ERROR
        result.message = (f"only {result.compared_tokens} of {result.output_tokens} compared {unit} are stable "
                          f"under the reference's own noise runs (minimum {MIN_STABLE_TOKENS}): the rest are "
                          f"near-ties, so this scenario cannot tell a right model from a wrong one (more {unit} needed)")
    elif high:
        p = high[0]
        result.status = status.TASK_ERROR
        result.message = (f"the reference's own {p} noise floor g={result.paths[p]['g']:.3f} "
                          f"(+{result.paths[p]['allowance']:.3f} sampling allowance at {result.compared_tokens} "
                          f"{unit}) reaches {FAIL_AT}: this scenario cannot tell a right model from a wrong "
                          f"one (more requests or {unit} needed)")
    elif blind:
        result.status = status.INSENSITIVE
        result.message = (f"built-in mutant(s) {', '.join(blind)} not caught here, so this case cannot see "
                          f"such bugs and does not count; the candidate had {verdict}")
    elif result.credit >= VALID_CREDIT:
        result.status = status.PASSED
    else:
        result.status = status.WRONG_RESULT
        result.message = f"{verdict}: credit {result.credit:.2f} < {VALID_CREDIT} on {result.path}"


# ---- timing (GPU) -------------------------------------------------------------------------------
def _time_once(fn: Callable[[], object]) -> float:
    """Seconds of one call with CUDA events (what the device spent, host gaps included, as a
    served request sees them)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


# A scenario that runs in milliseconds gets more rounds: at least this many seconds timed per side
# (the image embedder's 15 ms scenario read 3.3x against itself at 3 rounds on 2026-12-05), at most
# MAX_TIMED_ROUNDS rounds.
MIN_TIMED_S = 1.0
MAX_TIMED_ROUNDS = 31


def timed_rounds(rounds: int, seconds_per_call: float) -> int:
    """``rounds`` or more, enough for MIN_TIMED_S per side, odd (a median of one sample)."""
    wanted = max(rounds, min(MAX_TIMED_ROUNDS, math.ceil(MIN_TIMED_S / max(seconds_per_call, 1e-6))))
    return wanted | 1


def _time_pair(cand_fn, ref_fn, rounds: int) -> Tuple[float, float, int]:
    """Median seconds (candidate, reference) and the rounds timed, interleaved, order flipping every round, after one
    warm-up each (allocator, Triton compilation and autotuning, lazy tables); ``rounds`` at least,
    more for short calls (``timed_rounds``)."""
    cand_fn(), ref_fn()
    rounds = timed_rounds(rounds, max(_time_once(cand_fn), _time_once(ref_fn)))
    cand, ref = [], []
    for r in range(rounds):
        pair = [(cand_fn, cand), (ref_fn, ref)]
        for fn, samples in (pair if r % 2 == 0 else pair[::-1]):
            samples.append(_time_once(fn))
    return statistics.median(cand), statistics.median(ref), rounds


def _measure(result: E2EResult, cand_llm, ref_llm, requests, device, rounds) -> None:
    prompts, params = [list(p) for p, _ in requests], _params(requests)
    first = ([prompts[0]], params[:1])
    cand_s, ref_s, rounds = _time_pair(lambda: cand_llm.generate(prompts, params),
                                       lambda: ref_llm.generate(prompts, params), rounds)
    cand_1, ref_1, _ = _time_pair(lambda: cand_llm.generate(*first), lambda: ref_llm.generate(*first), rounds)
    tokens, tokens_1 = sum(n_out for _, n_out in requests), requests[0][1]
    result.cand_tokens_per_s, result.ref_tokens_per_s = tokens / cand_s, tokens / ref_s
    result.cand_ms_per_token, result.ref_ms_per_token = 1e3 * cand_1 / tokens_1, 1e3 * ref_1 / tokens_1
    result.speedup_throughput = ref_s / cand_s
    result.speedup_latency = ref_1 / cand_1
    result.speedup_blended = blend(result.speedup_throughput, result.speedup_latency)
    result.timing_mode = "cuda-events"
    result.informational = False
    result.rounds = rounds
