"""End-to-end scoring of embedding models: the encoder and its pooler served as an embedding server
serves them, candidate against reference (the rules of :mod:`fk_pytest.e2e`, on embeddings).

One case is a (model, scenario) pair: a list of real texts sent as ``embed`` requests to the
engine's :class:`~kernels_reference.engine.embedder.Embedder` (packed variable-length steps under a
token budget). Three statistics, each with its own noise floor, and the case's credit is the lowest
(``E2EResult.paths`` holds them all):

* ``cosine``: ``d`` = the mean over requests of 1 - cos(candidate embedding, reference embedding)
  (DESIGN "MacroEval": the anchor's metric). It sees a model that is wrong everywhere (a cosine of
  0.6 is d = 0.4) and nothing subtle: its credit runs linearly to 0 at ``FAIL_AT`` like every end-
  to-end credit. The floor is twice the largest noise run's mean (:data:`COSINE_ALLOWANCE`): a
  second correct implementation's rounding adds to the reference's own about as much again.
* ``centred-cosine``: the same mean of 1 - cos after subtracting, from candidate and reference
  alike, the mean of the reference's embeddings over the scenario's requests. Trained encoders'
  embeddings share a large common direction (anisotropy), and every request keeps it however
  broken the tower: the trained DINOv2-S's CLS embeddings of 448 px photos kept a plain cosine d of
  0.48 under attention scores scaled by 1/d instead of 1/sqrt(d), short of ``FAIL_AT``, and the
  case could not count. What tells requests apart is what is left after the common direction;
  there the same mutant reads 0.95 (measured on the CPU in float32, 2026-12-05).
* ``retrieval-rank``: every text is a query against all the others; its top-``top_k`` neighbours by
  inner product (how a vector index searches normalised embeddings) are what is compared, position
  by position, like the decoder cases' tokens: ``d`` = the share of stable (query, rank) positions
  whose neighbour differs from the reference's. A position a noise run changes is a near-tie of
  the reference's own similarities and is not scored; ``g`` and the sampling allowance are the
  token rule's (:func:`fk_pytest.e2e.noise_floor`, :func:`fk_pytest.e2e.sampling_allowance`). This
  is what sees subtle bugs: a pooler that skips the L2 normalisation leaves every cosine at 1 and
  reorders 56-64% of the neighbours (measured on all-MiniLM-L6-v2, tasks/embedding_e2e.py).

Noise runs (per model, once, :func:`calibrate`): the reference re-batched (requests reversed,
another token budget and sequence limit: other steps, other GEMM shapes), the reference in float64
(its own rounding error, which on the CPU is the only noise: a float32 CPU run repeats bit for bit
under re-batching), and on CUDA its plain-PyTorch definition. Built-in mutants
(:meth:`fk_pytest.e2e.E2ESpec.mutants`) are scored on both statistics; a case in which one keeps
credit is INSENSITIVE, as for the decoders.

Timing (GPU only): candidate and reference embedders interleaved, throughput in prompt tokens per
second over the scenario and latency of the first request alone, blended as for the decoders. The
steps run eagerly: a packed step's shape changes with every batch, so there is no fixed shape to
capture in a graph.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Dict, List, Optional, Tuple

import torch

from . import status
from .build import cast_copy, release_memory, with_paths
from .e2e import E2EResult, E2ESpec, Predictions, as_mutant, blend, noise_floor, noise_tallies, note_blindness, \
    sampling_allowance, stable_positions, tally
from .e2e_run import (CalibrationCache, Progress, _credit, _quiet, _time_pair, compose_candidate, composed_or_verdict,
                      decide, score_mutant)
from .errors import CandidateError, short_traceback

COSINE, CENTRED, RANK = "cosine", "centred-cosine", "retrieval-rank"
METRICS = (COSINE, CENTRED, RANK)
COSINES = (COSINE, CENTRED)
# The cosine floor is the largest noise run's mean times this (see the module docstring).
COSINE_ALLOWANCE = 1.0
TOP_K = 5  # neighbours compared per query


class EmbeddingE2ESpec(E2ESpec):
    """An end-to-end task over an embedding model: ``inputs`` gives each request's input (a text
    model's token ids, an image model's pixels), ``embedder`` the engine that serves them
    (default: the packed-text :class:`~kernels_reference.engine.embedder.Embedder`, with
    ``engine_args`` as its keyword arguments), ``build_reference`` the served model (encoder and
    pooler), ``input_tokens`` how many tokens one input is (for throughput)."""

    scoring = "embeddings"
    family = "embedding"
    top_k = TOP_K

    def inputs(self, case) -> list:
        raise NotImplementedError

    def embedder(self, model: torch.nn.Module, reference: torch.nn.Module, args: dict):
        """An engine serving ``model`` (the reference, a mutant or a composed candidate) within
        the reference's position limit (a candidate's own config is not trusted to say it)."""
        from kernels_reference.engine.embedder import Embedder
        return Embedder(model, max_position_embeddings=Embedder(reference).max_len, **args)

    def input_tokens(self, item) -> int:
        return len(item)


# ---- the statistics -----------------------------------------------------------------------------
def cosine_discrepancies(embeddings: torch.Tensor, expected: torch.Tensor, centred: bool = False) -> List[float]:
    """Per request, 1 - cos(embedding, expected), in float64 (clamped at 0: a rounding below it);
    ``centred``: both first less the mean of ``expected`` over the requests (see ``centred-cosine``)."""
    e, x = embeddings.double(), expected.double()
    if centred:
        if x.shape[0] < 2:
            raise ValueError("a centred cosine needs at least two requests (one request is its own mean)")
        centre = x.mean(0, keepdim=True)
        e, x = e - centre, x - centre
    cos = torch.nn.functional.cosine_similarity(e, x, dim=-1)
    return (1.0 - cos).clamp_min(0.0).tolist()


def neighbours(embeddings: torch.Tensor, k: int) -> Predictions:
    """Per text, the indices of its ``k`` nearest other texts by inner product, nearest first."""
    e = embeddings.double()
    sims = e @ e.T
    sims.fill_diagonal_(float("-inf"))
    return sims.topk(min(k, e.shape[0] - 1), dim=1).indices.tolist()


# ---- per model: targets, noise and mutants ------------------------------------------------------
@dataclasses.dataclass
class EmbeddingRun:
    """What the reference gives one scenario: its embeddings and neighbours, the noise runs'
    and each mutant's embeddings."""

    case_id: str
    inputs: list  # the requests' inputs (token ids or pixels)
    expected: torch.Tensor  # [N, H] the reference's embeddings
    noise: Dict[str, torch.Tensor]  # run -> [N, H]
    # name -> (kind, embeddings or None when the model has no module it replaces, classes swapped)
    mutants: Dict[str, Tuple[str, Optional[torch.Tensor], List[str]]]
    top_k: int = TOP_K

    @property
    def expected_neighbours(self) -> Predictions:
        return neighbours(self.expected, self.top_k)

    def noise_neighbours(self) -> Dict[str, Predictions]:
        return {name: neighbours(e, self.top_k) for name, e in self.noise.items()}


def calibrate(spec: EmbeddingE2ESpec, case, reference: torch.nn.Module, device: torch.device,
              progress: Progress) -> Dict[str, EmbeddingRun]:
    """Per scenario of ``case``'s model: the reference's embeddings, its noise runs and every
    built-in mutant's embeddings. Nothing here depends on the candidate."""
    runs = {}
    for sc in spec.model_cases(case):
        inputs = spec.inputs(sc)
        args = spec.engine_args(sc)

        def embed(model, engine_args=args, items=inputs):
            return spec.embedder(model, reference, engine_args).embed(items)

        tokens = sum(spec.input_tokens(x) for x in inputs)
        progress(f"{sc.id}: reference embeddings of {len(inputs)} requests, {tokens} tokens")
        run = EmbeddingRun(sc.id, inputs, embed(reference), {}, {}, spec.top_k)
        progress(f"{sc.id}: noise runs (re-batched, float64{', plain PyTorch' if device.type == 'cuda' else ''})")
        order = list(reversed(range(len(inputs))))
        shuffled = embed(reference, spec.rebatched_engine_args(sc), [inputs[i] for i in order])
        run.noise["rebatched"] = shuffled[torch.tensor(order).argsort()]
        wide = cast_copy(reference, torch.float64)
        run.noise["float64"] = embed(wide).to(run.expected.dtype)
        del wide
        if device.type == "cuda":
            native = with_paths(reference, "forward_native", share_parameters=True)
            run.noise["reference-native"] = embed(native)
            del native
        for name, entry in spec.mutants(sc).items():
            mutant_spec = as_mutant(entry)
            progress(f"{sc.id}: built-in mutant {name} ({mutant_spec.kind})")
            mutant, composition = compose_candidate(reference, mutant_spec.classes.get, share_parameters=True)
            embedded = embed(mutant) if composition.swapped else None
            run.mutants[name] = (mutant_spec.kind, embedded, list(composition.swapped))
            del mutant
        release_memory()
        runs[sc.id] = run
    return runs


# ---- judging --------------------------------------------------------------------------------------
def judge(result: E2EResult, runs: Dict[str, EmbeddingRun], case_id: str, embeddings: torch.Tensor) -> None:
    """Every statistic against its floor pooled over the model's scenarios; the case's credit is
    the lowest; the mutants, scored the same way, decide whether the case counts."""
    run = runs[case_id]
    g: Dict[str, Tuple[float, str]] = {}
    for m in COSINES:  # per kind of noise run, the mean over every request of the model's scenarios
        pooled: Dict[str, List[float]] = {}
        for sid, r in runs.items():
            for name, e in r.noise.items():
                per_request = cosine_discrepancies(e, r.expected, centred=m == CENTRED)
                pooled.setdefault(name, []).extend(per_request)
                result.noise[f"{sid}/{name}/{m}"] = per_request
        worst_run = max(pooled, key=lambda n: sum(pooled[n]) / len(pooled[n]))
        g[m] = (sum(pooled[worst_run]) / len(pooled[worst_run]), worst_run)
    # retrieval rank: the token rule on neighbour lists
    tallies = noise_tallies({sid: (r.expected_neighbours, r.noise_neighbours()) for sid, r in runs.items()})
    for key, t in tallies.items():
        result.noise[f"{key}/{RANK}"], result.noise_compared[f"{key}/{RANK}"] = t.per_request, t.compared_per_request
    g_rank, g_rank_run = noise_floor(tallies)
    expected = run.expected_neighbours
    stable = stable_positions(run.noise_neighbours(), expected)
    result.compared_tokens = sum(map(sum, stable))
    result.output_tokens = sum(map(len, expected))
    g[RANK] = (g_rank, g_rank_run)
    floors = {m: g[m][0] * (1.0 + COSINE_ALLOWANCE) for m in COSINES}
    floors[RANK] = g_rank + sampling_allowance(g_rank, result.compared_tokens)

    def measured(e: torch.Tensor) -> Tuple[Dict[str, float], Dict[str, List[float]]]:
        """(d per statistic, its per-request values) of embeddings ``e``."""
        per_request = {m: cosine_discrepancies(e, run.expected, centred=m == CENTRED) for m in COSINES}
        ranks = tally(neighbours(e, run.top_k), expected, stable)
        per_request[RANK] = ranks.per_request
        return {**{m: sum(per_request[m]) / len(per_request[m]) for m in COSINES}, RANK: ranks.d}, per_request

    scored, per_request = measured(embeddings)
    for m in METRICS:
        result.paths[m] = {"d": scored[m], "g": g[m][0], "g_run": g[m][1], "allowance": floors[m] - g[m][0],
                           "credit": _credit(scored[m], floors[m]), "d_requests": per_request[m], "steps": {}}
    result.path = min(METRICS, key=lambda m: (result.paths[m]["credit"], -(scored[m] - floors[m])))
    decided = result.paths[result.path]
    result.d, result.g, result.allowance = decided["d"], decided["g"], decided["allowance"]
    result.credit, result.d_requests = decided["credit"], list(decided["d_requests"])
    for name, (kind, embedded, swapped) in run.mutants.items():
        result.mutants[name] = score_mutant(kind, None if embedded is None else measured(embedded)[0], floors,
                                            swapped)
    decide(result, floors)


# ---- one case ---------------------------------------------------------------------------------------
def run_embedding_e2e(spec: EmbeddingE2ESpec, case, device, lookup, has_candidate: bool,
                      cache: Optional[CalibrationCache] = None, progress: Progress = _quiet) -> E2EResult:
    """Score one embedding case. ``lookup`` maps reference classes to the tree's (None: no tree)."""
    from .correctness import interpreted_launches
    from .guards import tampered

    started = time.perf_counter()
    device = torch.device(device)
    release_memory()
    result = E2EResult(case.id, spec.name, spec.family, case["model"], case["scenario"], unit="ranks")
    why = spec.unavailable(case)
    if why:
        result.message = why
        return result
    inputs = spec.inputs(case)
    result.requests = len(inputs)
    cache = cache or CalibrationCache()
    calibration = cache.model(spec, case, device)
    reference = calibration.reference
    args = spec.engine_args(case)

    candidate = composed_or_verdict(result, reference, lookup, has_candidate, cache)
    if candidate is None:
        return result

    if calibration.scenarios is None:
        calibration.scenarios = calibrate(spec, case, reference, device, progress)
    progress(f"{case.id}: candidate embeddings ({', '.join(result.swapped)})")
    try:
        with interpreted_launches(candidate) as launches:
            cand_embedder = spec.embedder(candidate, reference, args)
            embeddings = cand_embedder.embed(inputs)
    except CandidateError as exc:
        result.status, result.message = exc.status, exc.message
        return result
    except Exception as exc:
        result.status = status.RUNTIME_ERROR
        result.message = f"the candidate model failed in the embedder: {short_traceback(exc)}"
        return result
    names = tampered()
    if names:
        result.status, result.message = status.TAMPERED, f"candidate code replaced {', '.join(names[:5])}"
        return result
    if embeddings.shape != calibration.scenarios[case.id].expected.shape or not torch.isfinite(embeddings).all():
        result.status = status.WRONG_RESULT
        result.message = (f"the candidate's embeddings have shape {tuple(embeddings.shape)} (expected "
                          f"{tuple(calibration.scenarios[case.id].expected.shape)}) or are not all finite")
        return result
    result.interpreted = bool(launches["n"])
    result.interpreted_classes = sorted(launches["by_class"])
    result.pooled_over = list(calibration.scenarios)
    judge(result, calibration.scenarios, case.id, embeddings.to(calibration.scenarios[case.id].expected.dtype))
    note_blindness(spec, case, result)

    if device.type == "cuda" and result.status != status.TASK_ERROR:
        progress(f"{case.id}: timing candidate and reference embedders")
        try:
            # Pixels go to the GPU once, before the clock: the host-to-device copy is the same for
            # both embedders, and from pageable memory it was the noisiest part of a 15 ms scenario.
            on_device = [x.to(device) if torch.is_tensor(x) else x for x in inputs]
            _measure(result, cand_embedder, spec.embedder(reference, reference, args), on_device,
                     [spec.input_tokens(x) for x in inputs], spec.timing_rounds)
        except Exception as exc:
            result.status = status.RUNTIME_ERROR
            result.message = f"the candidate model failed while timed: {type(exc).__name__}: {exc}"
    result.seconds = time.perf_counter() - started
    return result


def _measure(result: E2EResult, cand, ref, inputs: list, tokens: List[int], rounds: int) -> None:
    """Throughput in input tokens per second over the scenario, latency of the first request
    alone (ms per input token, so that the fields mean what they mean for the decoders)."""
    first = inputs[:1]
    cand_s, ref_s, rounds = _time_pair(lambda: cand.embed(inputs), lambda: ref.embed(inputs), rounds)
    cand_1, ref_1, _ = _time_pair(lambda: cand.embed(first), lambda: ref.embed(first), rounds)
    result.cand_tokens_per_s, result.ref_tokens_per_s = sum(tokens) / cand_s, sum(tokens) / ref_s
    result.cand_ms_per_token, result.ref_ms_per_token = 1e3 * cand_1 / tokens[0], 1e3 * ref_1 / tokens[0]
    result.speedup_throughput, result.speedup_latency = ref_s / cand_s, ref_1 / cand_1
    result.speedup_blended = blend(result.speedup_throughput, result.speedup_latency)
    result.timing_mode, result.informational, result.rounds = "cuda-events", False, rounds
