"""Running one end-to-end case inside the evaluator (the rules are :mod:`fk_pytest.e2e`).

Per model, once (:class:`ModelCalibration`, cached by the evaluator): build the reference, and for
every scenario of the model generate the target sequences, run the noise runs and the built-in
mutants. Per case: compose the candidate, teacher-force it on the scenario's sequences, judge it
against the model's pooled noise floor, and (on a GPU) time it against the reference.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from . import status
from .build import copy_model, release_memory, with_paths
from .compose import Composition, swap_children
from .e2e import (FAIL_AT, NOISE_PERCENTILE, VALID_CREDIT, E2EResult, E2ESpec, MutantResult, Request,
                  blend, credit, discrepancies, percentile, sampling_allowance)
from .errors import CandidateError, short_traceback

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
        for m in layers:
            m.kv_cache = self._cache(num_blocks, block_size, param.dtype, param.device)

    def _cache(self, num_blocks, block_size, dtype, device):
        if self._new_cache is not None:
            return self._new_cache(num_blocks, block_size, dtype, device)
        shape = (num_blocks, block_size, self.config.num_key_value_heads, self.config.head_dim)
        return torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)


def unbind_kv_caches(model: torch.nn.Module) -> None:
    """Drop the KV caches the last engine bound to ``model``'s layers. The engine binds them to the
    modules it serves and nothing unbinds them when it goes: a reference kept for later runs would
    hold its last engine's cache (GBs at full size) while the next engine allocates its own."""
    for m in model.modules():
        if getattr(m, "kv_cache", None) is not None:
            m.kv_cache = None


def _engine(model: torch.nn.Module, reference: torch.nn.Module, args: dict):
    """An engine serving ``model`` (the reference, a mutant or a composed candidate) with the
    reference's config and cache layout."""
    from kernels_reference.engine import LLM
    return LLM(EngineModel(model, reference), **args)


def _params(requests: Sequence[Request]):
    from kernels_reference.engine import SamplingParams
    return [SamplingParams(max_tokens=n) for _, n in requests]


def teacher_forced(llm, run: "ScenarioRun") -> List[float]:
    """Per request, the discrepancy of ``llm``'s teacher-forced top-1 from the run's targets."""
    predictions = [list(map(int, p)) for p in llm.score(run.sequences, run.prompt_lens)]
    return discrepancies(predictions, run.sequences, run.prompt_lens)


def compose_candidate(reference: torch.nn.Module, lookup) -> Tuple[torch.nn.Module, Composition]:
    """A copy of the reference with every class ``lookup`` provides swapped in (the L4 class itself
    included), weights loaded strictly from the reference's; what failed is in the composition."""
    holder = torch.nn.Module()
    holder.model = copy_model(reference)
    composition = swap_children(holder, lookup) if lookup is not None else Composition()
    return holder.model, composition


# ---- per model: targets, noise and mutants of every scenario -----------------------------------
@dataclasses.dataclass
class ScenarioRun:
    """What the reference gives one scenario: targets, noise samples, mutant discrepancies."""

    case_id: str
    requests: List[Request]
    sequences: List[List[int]]
    prompt_lens: List[int]
    noise: Dict[str, List[float]]
    mutants: Dict[str, Tuple[Optional[float], List[str]]]  # name -> (mean d, classes swapped)


@dataclasses.dataclass
class ModelCalibration:
    """One model's reference and (once asked for) every scenario's targets, noise and mutants."""

    key: tuple
    reference: torch.nn.Module
    scenarios: Optional[Dict[str, ScenarioRun]] = None

    def pooled_noise(self) -> Dict[str, List[float]]:
        return {f"{sid}/{name}": samples for sid, run in self.scenarios.items()
                for name, samples in run.noise.items()}


def _calibration_key(spec: E2ESpec, case) -> tuple:
    return (spec.name,) + tuple((c.id, repr(sorted(c.params.items()))) for c in spec.model_cases(case))


def calibrate(spec: E2ESpec, case, reference: torch.nn.Module, device: torch.device,
              progress: Progress) -> Dict[str, ScenarioRun]:
    """For each scenario of ``case``'s model: the reference's greedy targets, its noise runs
    (re-scored as-is, re-batched, and on CUDA its plain-PyTorch definition) and each built-in
    mutant's discrepancy. Nothing here depends on the candidate."""
    scenarios = {}
    for sc in spec.model_cases(case):
        requests = spec.requests(sc)
        args, rebatched = _engine_args(spec, sc, device)
        prompts = [list(p) for p, _ in requests]
        progress(f"{sc.id}: reference generates {len(requests)} requests, "
                 f"{sum(n for _, n in requests)} tokens")
        outputs = _engine(reference, reference, args).generate(prompts, _params(requests))
        run = ScenarioRun(sc.id, requests, [p + list(o) for p, o in zip(prompts, outputs)],
                          [len(p) for p in prompts], {}, {})
        progress(f"{sc.id}: noise runs (teacher-forced, re-batched{', plain PyTorch' if device.type == 'cuda' else ''})")
        run.noise["teacher-forced"] = teacher_forced(_engine(reference, reference, args), run)
        order = list(reversed(range(len(run.sequences))))
        shuffled = ScenarioRun(sc.id, [requests[i] for i in order], [run.sequences[i] for i in order],
                               [run.prompt_lens[i] for i in order], {}, {})
        d = teacher_forced(_engine(reference, reference, rebatched), shuffled)
        run.noise["rebatched"] = [d[order.index(i)] for i in range(len(order))]
        if device.type == "cuda":
            # Two correct implementations of one model differ by their rounding: the reference's
            # plain-PyTorch definition (eager, no graphs) is the second.
            native = with_paths(reference, "forward_native")
            run.noise["reference-native"] = teacher_forced(
                _engine(native, reference, dict(args, cuda_graphs=False)), run)
            del native
            release_memory()
        for name, mapping in spec.mutants().items():
            progress(f"{sc.id}: built-in mutant {name}")
            mutant, composition = compose_candidate(reference, mapping.get)
            if not composition.swapped:
                run.mutants[name] = (None, [])
                continue
            d = teacher_forced(_engine(mutant, reference, args), run)
            run.mutants[name] = (sum(d) / len(d), composition.swapped)
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


class CalibrationCache:
    """One model's calibration at a time (a GPU holds one 8B reference, not four)."""

    def __init__(self):
        self.current: Optional[ModelCalibration] = None

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
            calibration.scenarios = calibrate(spec, case, calibration.reference, device, progress)
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
    candidate, composition = compose_candidate(reference, lookup)
    result.swapped, result.failed_classes = list(composition.swapped), dict(composition.failed)
    try:
        composition.raise_if_failed()
    except CandidateError as exc:
        result.status, result.message = exc.status, exc.message
        return result
    if has_candidate and not result.swapped:
        result.status = status.NOT_ATTEMPTED
        result.message = "no module of the candidate tree is used inside the model"
        return result

    calibration = cache.scenarios(spec, case, device, progress)
    run = calibration.scenarios[case.id]
    progress(f"{case.id}: candidate, teacher-forced ({', '.join(result.swapped)})")
    try:
        with interpreted_launches(candidate) as launches:
            cand_llm = _engine(candidate, reference, args)
            result.d_requests = teacher_forced(cand_llm, run)
    except CandidateError as exc:  # a call into a candidate class that cannot bind
        result.status, result.message = exc.status, exc.message
        return result
    except Exception as exc:
        result.status = status.RUNTIME_ERROR
        result.message = f"the candidate model failed in the engine: {short_traceback(exc)}"
        return result
    names = tampered()
    if names:
        result.status, result.message = status.TAMPERED, f"candidate code replaced {', '.join(names[:5])}"
        return result
    result.interpreted = bool(launches["n"])
    result.interpreted_classes = interpreted_classes = sorted(launches["by_class"])

    result.noise = calibration.pooled_noise()
    result.pooled_over = list(calibration.scenarios)
    if result.interpreted and next(reference.parameters()).dtype == torch.bfloat16:
        # The interpreter truncates bf16: the reference's own Triton path, interpreted, is the
        # noise such a candidate must be allowed (see fk_pytest.compare).
        # The classes whose candidate modules launched interpreted kernels run their reference
        # Triton path, interpreted, as in the candidate's run; the rest stay native.
        progress(f"{case.id}: reference's own Triton path for {', '.join(interpreted_classes)}, interpreted")
        triton_ref = with_paths(reference, "forward_triton", interpreted_classes)
        result.noise[f"{case.id}/reference-triton-interpreted"] = teacher_forced(
            _engine(triton_ref, reference, args), run)
        del triton_ref
        release_memory()
    _judge(result, run)

    if device.type == "cuda" and result.status not in (status.TASK_ERROR,):
        progress(f"{case.id}: timing candidate and reference engines")
        try:
            _measure(result, cand_llm, _engine(reference, reference, args), requests, device, spec.timing_rounds)
        except Exception as exc:
            result.status = status.RUNTIME_ERROR
            result.message = f"the candidate model failed while timed: {type(exc).__name__}: {exc}"
    result.seconds = time.perf_counter() - started
    return result


def _judge(result: E2EResult, run: ScenarioRun) -> None:
    """Credit against the pooled floor; the mutants decide whether the case can count at all."""
    samples = [d for values in result.noise.values() for d in values]
    result.g = percentile(samples, NOISE_PERCENTILE)
    result.d = sum(result.d_requests) / len(result.d_requests)
    result.allowance = sampling_allowance(result.g, result.output_tokens)
    floor = result.g + result.allowance
    result.credit = credit(result.d, floor) if floor < FAIL_AT else 0.0
    for name, (d, swapped) in run.mutants.items():
        result.mutants[name] = (MutantResult(note="the model has no module this mutant replaces")
                                if d is None else MutantResult(d, credit(d, floor) if floor < FAIL_AT else 0.0,
                                                               swapped))
    blind = [f"{n} (d={m.d:.3f}, credit {m.credit:.2f})" for n, m in result.mutants.items()
             if m.d is not None and not m.caught]
    verdict = (f"teacher-forced top-1 discrepancy d={result.d:.3f} against the pooled noise floor "
               f"g={result.g:.3f} (+{result.allowance:.3f} sampling allowance at {result.output_tokens} tokens)")
    if floor >= FAIL_AT:
        result.status = status.TASK_ERROR
        result.message = (f"the reference's own noise floor g={result.g:.3f} (+{result.allowance:.3f} sampling "
                          f"allowance at {result.output_tokens} tokens) reaches {FAIL_AT}: this scenario "
                          "cannot tell a right model from a wrong one (more requests or tokens needed)")
    elif blind:
        result.status = status.INSENSITIVE
        result.message = (f"built-in mutant(s) {', '.join(blind)} still earn credit here, so this case "
                          f"cannot see such bugs and does not count; the candidate had {verdict}, "
                          f"credit {result.credit:.2f}")
    elif result.credit >= VALID_CREDIT:
        result.status = status.PASSED
    else:
        result.status = status.WRONG_RESULT
        result.message = f"{verdict}: credit {result.credit:.2f} < {VALID_CREDIT}"


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


def _time_pair(cand_fn, ref_fn, rounds: int) -> Tuple[float, float]:
    """Median seconds (candidate, reference), interleaved, order flipping every round, after one
    warm-up each (allocator, Triton compilation and autotuning, lazy tables)."""
    cand_fn(), ref_fn()
    cand, ref = [], []
    for r in range(rounds):
        pair = [(cand_fn, cand), (ref_fn, ref)]
        for fn, samples in (pair if r % 2 == 0 else pair[::-1]):
            samples.append(_time_once(fn))
    return statistics.median(cand), statistics.median(ref)


def _measure(result: E2EResult, cand_llm, ref_llm, requests, device, rounds) -> None:
    prompts, params = [list(p) for p, _ in requests], _params(requests)
    first = ([prompts[0]], params[:1])
    cand_s, ref_s = _time_pair(lambda: cand_llm.generate(prompts, params),
                               lambda: ref_llm.generate(prompts, params), rounds)
    cand_1, ref_1 = _time_pair(lambda: cand_llm.generate(*first), lambda: ref_llm.generate(*first), rounds)
    tokens, tokens_1 = sum(n_out for _, n_out in requests), requests[0][1]
    result.cand_tokens_per_s, result.ref_tokens_per_s = tokens / cand_s, tokens / ref_s
    result.cand_ms_per_token, result.ref_ms_per_token = 1e3 * cand_1 / tokens_1, 1e3 * ref_1 / tokens_1
    result.speedup_throughput = ref_s / cand_s
    result.speedup_latency = ref_1 / cand_1
    result.speedup_blended = blend(result.speedup_throughput, result.speedup_latency)
    result.timing_mode = "cuda-events"
    result.informational = False
    result.rounds = rounds
