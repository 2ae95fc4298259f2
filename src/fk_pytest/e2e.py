"""End-to-end scoring: the whole model served by the engine, candidate against reference.

One e2e case is a (model, scenario) pair; the rules live here, the runs in
:mod:`fk_pytest.e2e_run` (inside the evaluator, the sterile worker by default, because the
candidate model is candidate code):

1. **Reference run.** The reference model (real trained weights where the spec has them, else
   random weights at a trained scale, seeded) is scored decode-forced on each request's prompt and
   continuation (:meth:`E2ESpec.continuations`: real text, fresh random ids, or by default its own
   greedy output); its top-1 at every position is what every other run is compared with.
2. **Two scoring paths**, both through the engine's scheduler and paged cache: ``prefill-forced``
   (every target token an input of packed, chunked prefill: ``LLM.score``) and ``decode-forced``
   (the prompt prefilled, then each target token fed as one decode step beside the scenario's
   other requests at their own lengths, mixed prefill + decode batches and preemption as the
   scheduler makes them, on CUDA through the captured decode graphs with padded batch sizes:
   ``LLM.score_decode``). A prefill-forced score alone cannot see a decode-only bug, nor an error
   that shifts every position of a sequence alike (attention is shift-invariant within a prompt).
3. **Noise runs.** The reference again, on both paths, under changes that move numerics but not
   semantics: the scenario's own engine settings, a re-batched engine (other request order and
   token budget), and on CUDA the reference's plain-PyTorch definition (a second correct
   implementation), and where the spec asks for it (:meth:`E2ESpec.rounding_noise`) the reference
   with every kernel's outputs rounded anew (:func:`fk_pytest.build.with_rounding`): a whole tree
   differs from the reference in every kernel at once, and on a random-weight MoE model that
   flipped more near-tied routes than the other runs did. A candidate that ran interpreted Triton
   kernels on the CPU adds the reference's own interpreted Triton path for its case.
4. **Stable positions.** A position some noise run flips is a near-tie of the reference's own
   logits: a flip there tells nothing about a kernel (with every position counted, the H200's bf16
   floors were 0.03-0.18 on 2026-12-02, docs/perf/h200-e2e-decode.md). Every run is scored on the positions all noise runs of its scenario
   keep (:func:`stable_positions`); each noise run itself on the positions the *other* noise runs
   keep (leave one out, :func:`noise_tallies`), so no run helps choose the positions it is scored
   on. ``d`` = flipped / compared stable tokens of the case (pooled over its requests). Per path,
   ``g`` = the largest flip rate of any kind of noise run pooled over the model's scenarios
   (:func:`noise_floor`): the same statistic. A case needs ``E2ESpec.min_compared_tokens`` target
   tokens (else TASK_ERROR) and ``MIN_STABLE_TOKENS`` stable ones.
   **Candidate run.** The composed candidate (every class the tree provides swapped in, weights
   copied) on both paths: credit = 1 at or below ``g`` plus a sampling allowance (two binomial
   standard errors at the stable token count, :func:`sampling_allowance`), 0 at ``FAIL_AT`` = 0.5,
   linear between. The case's credit is the lower of the two paths' (credit needs both).
5. **Sensitivity.** Built-in mutants of the reference (:meth:`E2ESpec.mutants`, kinds in
   :class:`Mutant`: gross bugs, graded subtle ones, decode-path ones) are composed in exactly like
   a candidate and scored on both paths. A case in which an applicable mutant is not caught is
   ``INSENSITIVE``: it could not see that bug, so its verdict does not count (it is left out of the
   end-to-end MacroEval, with a line saying so).
6. **Timing** (GPU only; CPU end-to-end timings are not taken, they would time the Triton
   interpreter). Candidate and reference engines generate the scenario interleaved, order
   flipping each round: throughput (output tokens/s) and latency (ms per output token of the first
   request served alone). Speedup = throughput^LAMBDA x latency^(1 - LAMBDA).

A task module declares an :class:`E2ESpec` and attaches the test with ``test_e2e = e2e_test(SPEC)``.
"""
from __future__ import annotations

import dataclasses
import importlib
import math
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from . import status

FAIL_AT = 0.5  # discrepancy at which credit reaches 0 (DESIGN: f = 0.5)
VALID_CREDIT = 0.9
SAMPLING_Z = 2.0  # standard errors of the token-count sampling allowed on top of the noise floor
LAMBDA = 0.5  # weight of throughput in the geometric speed blend
MIN_COMPARED_TOKENS = 64  # fewer compared tokens cannot resolve a few flipped tokens from noise
MIN_STABLE_TOKENS = 32  # of which at least this many must be positions no noise run flips

Request = Tuple[List[int], int]  # (prompt token ids, output tokens)

# The two ways a case is scored, both through the engine's scheduler and paged cache:
PREFILL = "prefill-forced"  # every target token an input of (chunked) prefill: LLM.score
DECODE = "decode-forced"  # the prompt prefilled, each target token fed as one decode step: LLM.score_decode
PATHS = (PREFILL, DECODE)

# Kinds of built-in mutant, and what catching each takes (see ``catch_at``).
GROSS, GRADED, DECODE_PATH = "gross", "graded", "decode-path"
MUTANT_KINDS = (GROSS, GRADED, DECODE_PATH)


@dataclasses.dataclass(frozen=True)
class Mutant:
    """A built-in bug: ``classes`` maps reference classes to the mutant classes composed in.

    ``gross``: breaks the model; caught when it loses all credit. ``graded``: a subtle mistake
    (small but real discrepancy on a trained model); ``decode-path``: right in prefill, wrong on
    decode steps. Those two are caught when the case fails them (credit below ``VALID_CREDIT``)."""

    classes: Dict[type, type]
    kind: str = GROSS

    def __post_init__(self):
        if self.kind not in MUTANT_KINDS:
            raise ValueError(f"mutant kind must be one of {MUTANT_KINDS}, got {self.kind!r}")


def as_mutant(value) -> Mutant:
    """A spec's mutant entry: a :class:`Mutant`, or a bare class mapping (a gross mutant)."""
    return value if isinstance(value, Mutant) else Mutant(dict(value))


def catch_at(kind: str, floor: float) -> float:
    """The discrepancy from which a mutant of ``kind`` is caught against ``floor`` (g + allowance):
    ``FAIL_AT`` for a gross one (no credit left), else where the credit drops below VALID_CREDIT."""
    if kind == GROSS:
        return FAIL_AT
    return floor + (1.0 - VALID_CREDIT) * (FAIL_AT - floor)


# ---- the scoring rules -------------------------------------------------------------------------
def credit(d: float, g: float, fail_at: float = FAIL_AT) -> float:
    """1 at or below the noise floor ``g``, 0 at or above ``fail_at``, linear between.

    A noise floor at or above ``fail_at`` leaves no room for a ramp: the credit is then a step at
    ``g`` (and the case is reported as a task error, since such a scenario cannot tell a right
    model from a wrong one)."""
    if not (math.isfinite(d) and math.isfinite(g)):
        raise ValueError(f"credit needs finite discrepancies, got d={d} g={g}")
    if d <= g:
        return 1.0
    if g >= fail_at or d >= fail_at:
        return 0.0
    return (fail_at - d) / (fail_at - g)


def sampling_allowance(g: float, tokens: int, z: float = SAMPLING_Z) -> float:
    """``z`` binomial standard errors of a disagreement rate measured on ``tokens`` compared tokens,
    at the noise floor's rate but never below one token in ``tokens``.

    A discrepancy is a count of flipped tokens: on a short scenario one flip is a large ``d`` (one
    request of 13 tokens: 0.077) and the floor rests on a few noise runs that may all be 0. Credit
    must not fall for a difference the sample cannot resolve, so the floor the credit ramp starts
    from is ``g`` plus this allowance; with many tokens it vanishes.
    """
    if tokens <= 0:
        return 0.0
    p = min(max(g, 1.0 / tokens), 1.0)
    return z * math.sqrt(p * (1.0 - p) / tokens)


Predictions = List[List[int]]  # per request, the top-1 at each compared position


@dataclasses.dataclass
class Tally:
    """Flipped and compared tokens of one run against the reference's top-1, on the stable positions."""

    flipped: int = 0
    compared: int = 0
    per_request: List[float] = dataclasses.field(default_factory=list)  # d of each request
    compared_per_request: List[int] = dataclasses.field(default_factory=list)

    @property
    def d(self) -> float:
        return self.flipped / self.compared if self.compared else 0.0

    def __add__(self, other: "Tally") -> "Tally":
        return Tally(self.flipped + other.flipped, self.compared + other.compared,
                     self.per_request + other.per_request, self.compared_per_request + other.compared_per_request)


def _check_lengths(predictions: Predictions, expected: Predictions) -> None:
    if len(predictions) != len(expected):
        raise ValueError(f"scoring returned {len(predictions)} requests for {len(expected)}")
    for pred, want in zip(predictions, expected):
        if len(pred) != len(want):
            raise ValueError(f"scoring returned {len(pred)} predictions for {len(want)} tokens")


def stable_positions(noise: Dict[str, Predictions], expected: Predictions,
                     leave_out: Optional[str] = None) -> List[List[bool]]:
    """Per request and position: whether every noise run (but ``leave_out``) predicted the
    reference's top-1 there. A position a correct implementation flips is a near-tie: a flip there
    says nothing about a kernel, so no run is scored on it."""
    runs = [p for name, p in noise.items() if name != leave_out]
    for p in runs:
        _check_lengths(p, expected)
    return [[all(int(p[r][i]) == int(want[i]) for p in runs) for i in range(len(want))]
            for r, want in enumerate(expected)]


def tally(predictions: Predictions, expected: Predictions, stable: List[List[bool]]) -> Tally:
    """``predictions`` against ``expected`` on the ``stable`` positions: the flips, pooled over
    requests (d is the share of compared tokens flipped) and per request."""
    _check_lengths(predictions, expected)
    out = Tally()
    for pred, want, keep in zip(predictions, expected, stable):
        n = sum(keep)
        flips = sum(1 for a, b, k in zip(pred, want, keep) if k and int(a) != int(b))
        out.flipped, out.compared = out.flipped + flips, out.compared + n
        out.per_request.append(flips / n if n else 0.0)
        out.compared_per_request.append(n)
    return out


def noise_tallies(scenarios: Dict[str, Tuple[Predictions, Dict[str, Predictions]]]) -> Dict[str, Tally]:
    """Every noise run of every scenario ("scenario/run/path" -> :class:`Tally`), each scored on
    the positions its scenario's *other* noise runs keep stable (leave one out): the statistic a
    candidate's d is, and no run helps choose the positions it is scored on."""
    out = {}
    for sid, (expected, noise) in scenarios.items():
        for name, predictions in noise.items():
            out[f"{sid}/{name}"] = tally(predictions, expected, stable_positions(noise, expected, leave_out=name))
    return out


def pooled_noise(tallies: Dict[str, Tally], path: Optional[str] = None) -> Dict[str, Tally]:
    """Per kind of noise run ("run/path", of ``path`` only if given), its tallies pooled over the
    model's scenarios: one flip rate from all their tokens. Kinds with nothing compared are left out."""
    pooled: Dict[str, Tally] = {}
    for key, t in tallies.items():
        run = key.split("/", 1)[1] if "/" in key else key
        if path is None or run.endswith("/" + path):
            pooled[run] = pooled.get(run, Tally()) + t
    return {k: t for k, t in pooled.items() if t.compared}


def noise_floor(tallies: Dict[str, Tally], path: Optional[str] = None) -> Tuple[float, str]:
    """``g`` and the run that sets it: per kind of noise run (:func:`pooled_noise`), the largest
    flip rate. A per-scenario or per-request maximum would set the floor by the shortest sample's
    luck."""
    pooled = pooled_noise(tallies, path)
    if not pooled:
        raise ValueError("no noise run to set a floor from")
    run = max(pooled, key=lambda k: pooled[k].d)
    return pooled[run].d, run


def blend(throughput_speedup: float, latency_speedup: float, lam: float = LAMBDA) -> float:
    return throughput_speedup ** lam * latency_speedup ** (1.0 - lam)


# ---- what a task module declares ---------------------------------------------------------------
class E2ESpec:
    """Base class of an end-to-end task. Subclasses set the attributes and implement the hooks."""

    name: str = ""  # e.g. "llm_e2e"
    level: int = 4
    family: str = "llm"  # the end-to-end MacroEval family
    marker: str = "model"  # the pytest family marker
    timing_rounds: int = 3  # interleaved rounds per engine on CUDA (after one warm-up each)
    cuda_graphs: bool = True  # decode in CUDA graphs on the GPU, as production does
    min_compared_tokens: int = MIN_COMPARED_TOKENS
    # What a case is scored on: "tokens" (a decoder's top-1, fk_pytest.e2e_run) or "embeddings"
    # (an encoder's pooled output and retrieval ranks, fk_pytest.e2e_embed).
    scoring: str = "tokens"

    def cases(self, profile: str, scale: Optional[float] = None) -> Sequence:
        """Cases with id "<model>-<scenario>" and params ``model`` and ``scenario``."""
        raise NotImplementedError

    def model_cases(self, case) -> Sequence:
        """The cases of ``case``'s model that its noise floor is pooled over (itself included)."""
        return [case]

    def unavailable(self, case) -> Optional[str]:
        """Why this case cannot run here (e.g. its weights are not installed), or None."""
        return None

    def blind_reason(self, case) -> Optional[str]:
        """What is on record about why this case cannot see some built-in mutant (what was
        measured, what was tried), added to an INSENSITIVE verdict's message; None where nothing is."""
        return None

    def build_reference(self, case, device: torch.device) -> torch.nn.Module:
        """The L4 reference model in the case's dtype on ``device`` (the same for all of a model's
        cases: the evaluator builds it once per model)."""
        raise NotImplementedError

    def build_architecture(self, case, device: torch.device) -> torch.nn.Module:
        """The reference model's modules without their weights (any values), on ``device``. A case
        at tensor-parallel degree > 1 builds it on each rank, inside the rank's parallel state, and
        loads the rank's cut of ``build_reference``'s weights (fk_pytest.e2e_tp)."""
        raise NotImplementedError(f"{type(self).__name__} has no build_architecture: its cases cannot run at "
                                  "tensor-parallel degree > 1")

    def requests(self, case) -> List[Request]:
        raise NotImplementedError

    def continuations(self, case) -> Optional[List[List[int]]]:
        """The tokens each request is scored on after its prompt (as many as its output tokens),
        or None to score on the reference's own greedy output. Given tokens keep every scored
        position informative: a greedy continuation can fall into a loop the model predicts with
        certainty, where no bug flips a token. Either way ``d`` compares against the reference's
        own decode-forced top-1 on the same tokens."""
        return None

    def engine_args(self, case) -> dict:
        """Keyword arguments of ``kernels_reference.engine.LLM`` for the scenario."""
        raise NotImplementedError

    def rebatched_engine_args(self, case) -> dict:
        """The same engine with another token budget / batch size (the noise run)."""
        raise NotImplementedError

    def rounding_noise(self, case) -> bool:
        """Whether the case's calibration adds the noise run with every kernel's outputs
        rounded anew (:func:`fk_pytest.build.with_rounding`). It widens the floor: meant for cases
        whose near-tied logits or routes amplify rounding that an honest tree's kernels all add."""
        return False

    def mutants(self, case=None) -> Dict[str, "Mutant"]:
        """Built-in bugs that apply to ``case``: name -> :class:`Mutant` (or a bare {reference class:
        mutant class} mapping, a gross one), composed in like a candidate."""
        return {}


def spec_ref(spec: E2ESpec) -> Tuple[str, str]:
    return type(spec).__module__, spec.name


def resolve_spec(ref: Tuple[str, str]) -> E2ESpec:
    module = importlib.import_module(ref[0])
    for value in vars(module).values():
        if isinstance(value, E2ESpec) and value.name == ref[1]:
            return value
    raise LookupError(f"no end-to-end spec {ref[1]!r} in {ref[0]}")


# ---- the result ---------------------------------------------------------------------------------
@dataclasses.dataclass
class MutantResult:
    """One built-in bug run inside a case: a sensitive case catches it (``Mutant`` says how)."""

    d: Optional[float] = None  # the worse path's discrepancy
    credit: Optional[float] = None  # the lower of the two paths' credits
    swapped: List[str] = dataclasses.field(default_factory=list)
    note: str = ""
    kind: str = GROSS
    paths: Dict[str, float] = dataclasses.field(default_factory=dict)  # path -> d
    catch_at: Optional[float] = None  # the d from which it is caught here

    @property
    def caught(self) -> bool:
        if self.credit is None:
            return False
        return self.credit <= 0.0 if self.kind == GROSS else self.credit < VALID_CREDIT

    @property
    def margin(self) -> Optional[float]:
        """How far past the point where it counts as caught its discrepancy lies (>= 0: caught)."""
        if self.d is None:
            return None
        return self.d - (FAIL_AT if self.catch_at is None else self.catch_at)

    def as_json(self) -> dict:
        return {"d": self.d, "credit": self.credit, "margin": self.margin, "caught": self.caught,
                "swapped": self.swapped, "note": self.note, "kind": self.kind, "paths": self.paths,
                "catch_at": self.catch_at}


@dataclasses.dataclass
class E2EResult:
    case_id: str
    spec: str
    family: str
    model: str
    scenario: str
    status: str = status.NOT_RUN
    message: str = ""
    # d, g, allowance, credit and d_requests are the deciding path's (the lower credit); ``paths``
    # holds both: path -> {d, g, allowance, credit, d_requests, steps (engine steps by kind)}.
    d: Optional[float] = None  # candidate discrepancy (share of the stable compared tokens flipped)
    g: Optional[float] = None  # noise floor (largest pooled flip rate of any kind of noise run)
    allowance: Optional[float] = None  # sampling allowance at this many stable compared tokens
    credit: float = 0.0
    d_requests: List[float] = dataclasses.field(default_factory=list)
    path: Optional[str] = None  # the deciding path
    paths: Dict[str, dict] = dataclasses.field(default_factory=dict)
    noise: Dict[str, List[float]] = dataclasses.field(default_factory=dict)  # "scenario/run/path" -> per-request d
    noise_compared: Dict[str, List[int]] = dataclasses.field(default_factory=dict)  # same keys -> tokens scored
    pooled_over: List[str] = dataclasses.field(default_factory=list)  # the model's cases in the floor
    mutants: Dict[str, MutantResult] = dataclasses.field(default_factory=dict)
    requests: int = 0
    output_tokens: int = 0  # target tokens (the forced positions)
    compared_tokens: int = 0  # of which stable under the reference's noise runs: what d is scored on
    unit: str = "tokens"  # what output_tokens and compared_tokens count ("ranks" for embedding cases)
    swapped: List[str] = dataclasses.field(default_factory=list)
    failed_classes: Dict[str, str] = dataclasses.field(default_factory=dict)
    interpreted: bool = False  # the candidate launched Triton kernels through the CPU interpreter
    interpreted_classes: List[str] = dataclasses.field(default_factory=list)  # whose modules did
    ref_tokens_per_s: Optional[float] = None
    cand_tokens_per_s: Optional[float] = None
    ref_ms_per_token: Optional[float] = None  # latency: first request served alone
    cand_ms_per_token: Optional[float] = None
    speedup_throughput: Optional[float] = None
    speedup_latency: Optional[float] = None
    speedup_blended: Optional[float] = None
    timing_mode: Optional[str] = None  # "cuda-events", or None when not timed (CPU)
    rounds: int = 0
    informational: bool = True  # no GPU timing: never enters MacroEval's S
    seconds: float = 0.0

    @property
    def valid(self) -> bool:
        return self.status == status.PASSED

    @property
    def counts(self) -> bool:
        """Whether the case enters the end-to-end MacroEval (ran, and could see the mutants)."""
        return self.status not in (status.NOT_RUN, status.INSENSITIVE)

    @property
    def speedup(self) -> Optional[float]:
        """The blended GPU speedup of a valid case (None on CPU or when not valid)."""
        return self.speedup_blended if self.valid and not self.informational else None

    @property
    def min_mutant_margin(self) -> Optional[float]:
        margins = [m.margin for m in self.mutants.values() if m.margin is not None]
        return min(margins) if margins else None

    def as_json(self) -> dict:
        out = dataclasses.asdict(self)
        out["mutants"] = {k: m.as_json() for k, m in self.mutants.items()}
        out.update(valid=self.valid, speedup=self.speedup, min_mutant_margin=self.min_mutant_margin)
        return out


# ---- the pytest side ---------------------------------------------------------------------------
def e2e_test(spec: E2ESpec):
    """The end-to-end test of ``spec``, parametrized by the plugin with its (model, scenario) cases."""
    import pytest

    def test_e2e(case, fk_session):
        result = fk_session.evaluate_e2e(spec, case)
        if result.status == status.NOT_ATTEMPTED:
            pytest.skip(f"not attempted: {result.message}")
        if result.status == status.NOT_RUN:  # e.g. the model's weights are not installed here
            pytest.skip(result.message)
        if result.status == status.INSENSITIVE:  # the case could not see a known bug: no verdict
            pytest.skip(f"{status.INSENSITIVE} [{case.id}]: {result.message}")
        if not result.valid:
            pytest.fail(f"{result.status} [{case.id}]: {result.message}", pytrace=False)

    test_e2e._fk_e2e = spec
    test_e2e.__doc__ = f"end-to-end score of the {spec.family} models ({spec.name}) — generated by fk_pytest"
    for mark in (getattr(pytest.mark, f"level{spec.level}"), getattr(pytest.mark, spec.marker)):
        mark(test_e2e)
    return test_e2e


def note_blindness(spec: E2ESpec, case, result: E2EResult) -> None:
    """An INSENSITIVE case's message gains the spec's account of why (``blind_reason``), so the
    report says why a shipped case stays blind, not only that it does."""
    why = spec.blind_reason(case) if result.status == status.INSENSITIVE else None
    if why:
        result.message += f"; on record: {why}"
