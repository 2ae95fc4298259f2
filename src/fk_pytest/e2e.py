"""End-to-end scoring: the whole model served by the engine, candidate against reference.

One e2e case is a (model, scenario) pair. Everything below runs in the evaluator (the sterile
worker by default), because the candidate model is candidate code:

1. **Reference run.** The reference model (random weights from the real config, seeded) generates
   greedily through the engine; its sequences are the teacher-forcing targets.
2. **Noise runs.** The reference again, teacher-forced on those sequences under changes that move
   numerics but not semantics: the scenario's own engine settings (teacher forcing prefills what
   generation decoded) and a re-batched engine (other request order and token budget, so GEMM
   shapes, chunk boundaries and reduction orders change). On a CPU under Triton's interpreter,
   when the candidate launched interpreted kernels, also the reference's own Triton path: the
   interpreter truncates bf16 (see :mod:`fk_pytest.compare`), and the candidate must not be charged
   for that. On CUDA also the reference's plain-PyTorch definition (``forward_native`` everywhere,
   eager): a second correct implementation, whose rounding differs from the fast kernels' as any
   honest candidate's does. Every request of every noise run is one sample of ``d``; ``g`` = their
   95th percentile.
3. **Candidate run.** The composed candidate (every class the tree provides swapped in, weights
   copied) teacher-forced under the scenario's engine settings: ``d`` = mean over requests of
   1 - top-1 agreement; credit = 1 at or below ``g`` plus a sampling allowance (two binomial
   standard errors at the compared token count, :func:`sampling_allowance`), 0 at ``FAIL_AT`` = 0.5,
   linear between.
4. **Timing.** Candidate and reference engines generate the scenario interleaved, order flipping
   each round: throughput (output tokens/s over the scenario) and latency (ms per output token of
   the first request served alone). Speedup = throughput^LAMBDA x latency^(1 - LAMBDA). GPU runs
   time with CUDA events; CPU timings are informational and never enter MacroEval.

A task module declares an :class:`E2ESpec` and attaches the test with ``test_e2e = e2e_test(SPEC)``.
"""
from __future__ import annotations

import copy
import dataclasses
import importlib
import math
import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from . import status

FAIL_AT = 0.5  # discrepancy at which credit reaches 0 (DESIGN: f = 0.5)
NOISE_PERCENTILE = 95.0
VALID_CREDIT = 0.9
SAMPLING_Z = 2.0  # standard errors of the token-count sampling allowed on top of the noise floor
LAMBDA = 0.5  # weight of throughput in the geometric speed blend

Request = Tuple[List[int], int]  # (prompt token ids, output tokens)


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


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default), without numpy."""
    if not values:
        raise ValueError("percentile of no values")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def discrepancies(predictions: Sequence[Sequence[int]], sequences: Sequence[Sequence[int]],
                  prompt_lens: Sequence[int]) -> List[float]:
    """Per request: 1 - share of generated tokens that the teacher-forced top-1 reproduces."""
    out = []
    for pred, seq, n in zip(predictions, sequences, prompt_lens):
        target = list(seq[n:])
        if len(pred) != len(target):
            raise ValueError(f"teacher forcing returned {len(pred)} predictions for {len(target)} tokens")
        out.append(1.0 - sum(int(a) == int(b) for a, b in zip(pred, target)) / max(len(target), 1))
    return out


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

    def cases(self, profile: str) -> Sequence:  # Cases: id "<model>-<scenario>", params model/scenario
        raise NotImplementedError

    def build_reference(self, case, device: torch.device) -> torch.nn.Module:
        """The L4 reference model, weights seeded, in the case's dtype, on ``device``."""
        raise NotImplementedError

    def requests(self, case) -> List[Request]:
        raise NotImplementedError

    def engine_args(self, case) -> dict:
        """Keyword arguments of ``kernels_reference.engine.LLM`` for the scenario."""
        raise NotImplementedError

    def rebatched_engine_args(self, case) -> dict:
        """The same engine with another token budget / batch size (the noise run)."""
        raise NotImplementedError


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
class E2EResult:
    case_id: str
    spec: str
    family: str
    model: str
    scenario: str
    status: str = status.NOT_RUN
    message: str = ""
    d: Optional[float] = None  # candidate discrepancy (mean over requests)
    g: Optional[float] = None  # noise floor (95th percentile of the noise samples)
    allowance: Optional[float] = None  # sampling allowance at this many compared tokens
    credit: float = 0.0
    d_requests: List[float] = dataclasses.field(default_factory=list)
    noise: Dict[str, List[float]] = dataclasses.field(default_factory=dict)  # run -> per-request d
    requests: int = 0
    output_tokens: int = 0
    swapped: List[str] = dataclasses.field(default_factory=list)
    interpreted: bool = False  # the candidate launched Triton kernels through the CPU interpreter
    ref_tokens_per_s: Optional[float] = None
    cand_tokens_per_s: Optional[float] = None
    ref_ms_per_token: Optional[float] = None  # latency: first request served alone
    cand_ms_per_token: Optional[float] = None
    speedup_throughput: Optional[float] = None
    speedup_latency: Optional[float] = None
    speedup_blended: Optional[float] = None
    timing_mode: Optional[str] = None  # "cuda-events" | "cpu-wall"
    rounds: int = 0
    informational: bool = True  # CPU timings never enter MacroEval
    seconds: float = 0.0

    @property
    def valid(self) -> bool:
        return self.status == status.PASSED

    @property
    def speedup(self) -> Optional[float]:
        """The blended GPU speedup of a valid case (None on CPU or when not valid)."""
        return self.speedup_blended if self.valid and not self.informational else None

    def as_json(self) -> dict:
        out = dataclasses.asdict(self)
        out.update(valid=self.valid, speedup=self.speedup)
        return out


# ---- the engine's view of any model tree -------------------------------------------------------
class EngineModel(torch.nn.Module):
    """What the engine needs (``forward``, ``compute_logits``, ``allocate_kv_cache``) around a
    model whose contract is only the L4 ``forward(input_ids, positions)``: a candidate L4 class
    need not reimplement the serving plumbing. KV caches go to every module exposing ``kv_cache``
    (the attention contract), so a candidate attention is fed exactly like the reference's."""

    def __init__(self, root: torch.nn.Module, config):
        super().__init__()
        self.root = root
        self.config = config  # the engine reads max_position_embeddings and vocab_size

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
        shape = (num_blocks, block_size, self.config.num_key_value_heads, self.config.head_dim)
        for m in layers:
            m.kv_cache = (torch.zeros(shape, dtype=param.dtype, device=param.device),
                          torch.zeros(shape, dtype=param.dtype, device=param.device))


def _engine(model: EngineModel, args: dict):
    from kernels_reference.engine import LLM
    return LLM(model, **args)


def _params(requests: Sequence[Request]):
    from kernels_reference.engine import SamplingParams
    return [SamplingParams(max_tokens=n) for _, n in requests]


def teacher_forced_top1(llm, sequences: List[List[int]], prompt_lens: List[int]) -> List[List[int]]:
    """Per sequence the greedy top-1 at positions prompt_len-1 .. len-2, through the engine path."""
    return [list(map(int, p)) for p in llm.score(sequences, prompt_lens)]


# ---- timing -------------------------------------------------------------------------------------
def _time_once(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds of one call: CUDA events on the GPU (what the device spent, host gaps included,
    as a served request sees them), the host clock on the CPU."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _time_pair(cand_fn, ref_fn, device: torch.device, rounds: int) -> Tuple[float, float, int]:
    """Median seconds (candidate, reference), interleaved, order flipping every round."""
    on_gpu = device.type == "cuda"
    if on_gpu:  # warm-up: allocator, Triton compilation and autotuning, lazy tables
        cand_fn(), ref_fn()
    rounds = rounds if on_gpu else 1
    cand, ref = [], []
    for r in range(rounds):
        pair = [(cand_fn, cand), (ref_fn, ref)]
        for fn, samples in (pair if r % 2 == 0 else pair[::-1]):
            samples.append(_time_once(fn, device))
    return statistics.median(cand), statistics.median(ref), rounds


# ---- the evaluation -----------------------------------------------------------------------------
def _with_paths(model: torch.nn.Module, method: str) -> torch.nn.Module:
    """A copy of the reference whose modules run another of their own implementations:
    ``forward_triton`` (interpreted on a CPU) or ``forward_native`` (plain PyTorch)."""
    twin = copy.deepcopy(model)
    for m in twin.modules():
        if m is not twin and callable(getattr(m, method, None)):
            m.forward = getattr(m, method)
    return twin


def compose_candidate(reference: torch.nn.Module, lookup) -> Tuple[torch.nn.Module, List[str]]:
    """The candidate model: a copy of the reference with every class the tree provides swapped in
    (the L4 class itself included), weights loaded strictly from the reference's."""
    from .compose import swap_children

    holder = torch.nn.Module()
    holder.model = copy.deepcopy(reference)
    swapped = swap_children(holder, lookup) if lookup is not None else []
    return holder.model, swapped


def run_e2e(spec: E2ESpec, case, device, lookup, has_candidate: bool) -> E2EResult:
    """Score one e2e case. ``lookup`` maps reference classes to the tree's (None: no tree)."""
    from .correctness import interpreted_launches
    from .guards import tampered

    started = time.perf_counter()
    device = torch.device(device)
    result = E2EResult(case.id, spec.name, spec.family, case["model"], case["scenario"])
    requests = spec.requests(case)
    prompts = [list(p) for p, _ in requests]
    prompt_lens = [len(p) for p in prompts]
    result.requests, result.output_tokens = len(requests), sum(n for _, n in requests)

    reference = spec.build_reference(case, device)
    wrap = lambda m: EngineModel(m, reference.config)  # noqa: E731
    args, rebatched = spec.engine_args(case), spec.rebatched_engine_args(case)
    if device.type == "cuda" and spec.cuda_graphs:  # production decodes in CUDA graphs
        args, rebatched = dict(args, cuda_graphs=True), dict(rebatched, cuda_graphs=True)

    # The candidate is composed first: before the reference's caches exist (the copy stays small),
    # and a tree that touches nothing in the model costs no run at all.
    candidate, result.swapped = compose_candidate(reference, lookup)
    if has_candidate and not result.swapped:
        result.status = status.NOT_ATTEMPTED
        result.message = "no module of the candidate tree is used inside the model"
        return result

    # 1. the reference's greedy sequences are the targets
    ref_model = wrap(reference)
    ref_llm = _engine(ref_model, args)
    outputs = ref_llm.generate(prompts, _params(requests))
    sequences = [p + list(o) for p, o in zip(prompts, outputs)]

    # 3. the candidate, before the noise runs: whether it ran interpreted Triton decides one of them
    try:
        with interpreted_launches() as launches:
            cand_llm = _engine(wrap(candidate), args)
            cand_pred = teacher_forced_top1(cand_llm, sequences, prompt_lens)
    except Exception as exc:
        result.status = status.RUNTIME_ERROR
        result.message = f"the candidate model failed in the engine: {type(exc).__name__}: {exc}"
        return result
    names = tampered()
    if names:
        result.status, result.message = status.TAMPERED, f"candidate code replaced {', '.join(names[:5])}"
        return result
    result.interpreted = bool(launches["n"])
    result.d_requests = discrepancies(cand_pred, sequences, prompt_lens)

    # 2. noise runs of the reference
    result.noise["teacher-forced"] = discrepancies(
        teacher_forced_top1(ref_llm, sequences, prompt_lens), sequences, prompt_lens)
    order = list(reversed(range(len(sequences))))
    shuffled = teacher_forced_top1(_engine(ref_model, rebatched), [sequences[i] for i in order],
                                   [prompt_lens[i] for i in order])
    result.noise["rebatched"] = discrepancies([shuffled[order.index(i)] for i in range(len(order))],
                                              sequences, prompt_lens)
    if result.interpreted and reference_dtype(reference) == torch.bfloat16:
        triton_llm = _engine(wrap(_with_paths(reference, "forward_triton")), args)
        result.noise["reference-triton-interpreted"] = discrepancies(
            teacher_forced_top1(triton_llm, sequences, prompt_lens), sequences, prompt_lens)
        del triton_llm
    if device.type == "cuda":
        # Two correct implementations of one model differ by their rounding: the reference's
        # plain-PyTorch definition (eager, no graphs: its attention loops on the host) is the
        # second. On random weights near-tied logits make top-1 sensitive to exactly this.
        native_llm = _engine(wrap(_with_paths(reference, "forward_native")), dict(args, cuda_graphs=False))
        result.noise["reference-native"] = discrepancies(
            teacher_forced_top1(native_llm, sequences, prompt_lens), sequences, prompt_lens)
        del native_llm
    ref_llm = _engine(ref_model, args)  # the rebatched engine re-bound the reference's caches

    samples = [d for run in result.noise.values() for d in run]
    result.g = percentile(samples, NOISE_PERCENTILE)
    result.d = sum(result.d_requests) / len(result.d_requests)
    result.allowance = sampling_allowance(result.g, result.output_tokens)
    floor = result.g + result.allowance
    result.credit = credit(result.d, floor) if floor < FAIL_AT else 0.0
    if floor >= FAIL_AT:
        result.status = status.TASK_ERROR
        result.message = (f"the reference's own noise floor g={result.g:.3f} (+{result.allowance:.3f} sampling "
                          f"allowance at {result.output_tokens} tokens) reaches {FAIL_AT}: this scenario "
                          "cannot tell a right model from a wrong one (more requests or tokens needed)")
    elif result.credit >= VALID_CREDIT:
        result.status = status.PASSED
    else:
        result.status = status.WRONG_RESULT
        result.message = (f"teacher-forced top-1 discrepancy d={result.d:.3f} against the reference's "
                          f"noise floor g={result.g:.3f} (+{result.allowance:.3f} sampling allowance at "
                          f"{result.output_tokens} tokens): credit {result.credit:.2f} < {VALID_CREDIT}")

    # 4. timing, side by side
    try:
        _measure(result, cand_llm, ref_llm, requests, device, spec.timing_rounds)
    except Exception as exc:
        result.status = status.RUNTIME_ERROR
        result.message = f"the candidate model failed while timed: {type(exc).__name__}: {exc}"
    result.seconds = time.perf_counter() - started
    return result


def reference_dtype(model: torch.nn.Module) -> torch.dtype:
    return next(model.parameters()).dtype


def _measure(result: E2EResult, cand_llm, ref_llm, requests, device, rounds) -> None:
    prompts, params = [list(p) for p, _ in requests], _params(requests)
    first = ([prompts[0]], params[:1])
    cand_s, ref_s, n = _time_pair(lambda: cand_llm.generate(prompts, params),
                                  lambda: ref_llm.generate(prompts, params), device, rounds)
    cand_1, ref_1, _ = _time_pair(lambda: cand_llm.generate(*first), lambda: ref_llm.generate(*first),
                                  device, rounds)
    tokens, tokens_1 = sum(n_out for _, n_out in requests), requests[0][1]
    result.cand_tokens_per_s, result.ref_tokens_per_s = tokens / cand_s, tokens / ref_s
    result.cand_ms_per_token, result.ref_ms_per_token = 1e3 * cand_1 / tokens_1, 1e3 * ref_1 / tokens_1
    result.speedup_throughput = ref_s / cand_s
    result.speedup_latency = ref_1 / cand_1
    result.speedup_blended = blend(result.speedup_throughput, result.speedup_latency)
    result.timing_mode = "cuda-events" if device.type == "cuda" else "cpu-wall"
    result.informational = device.type != "cuda"
    result.rounds = n


# ---- the pytest side ---------------------------------------------------------------------------
def e2e_test(spec: E2ESpec):
    """The end-to-end test of ``spec``, parametrized by the plugin with its (model, scenario) cases."""
    import pytest

    def test_e2e(case, fk_session):
        result = fk_session.evaluate_e2e(spec, case)
        if result.status == status.NOT_ATTEMPTED:
            pytest.skip(f"not attempted: {result.message}")
        if not result.valid:
            pytest.fail(f"{result.status} [{case.id}]: {result.message}", pytrace=False)

    test_e2e._fk_e2e = spec
    test_e2e.__doc__ = f"end-to-end score of the {spec.family} models ({spec.name}) — generated by fk_pytest"
    for mark in (getattr(pytest.mark, f"level{spec.level}"), getattr(pytest.mark, spec.marker)):
        mark(test_e2e)
    return test_e2e
