"""Run one case through reference, candidate and float64 truth, and give the verdict.

Order of checks (the first failure names the status): the candidate runs at all; the outputs have
the reference's structure, shapes and dtypes; inputs it must not touch are untouched and not
aliased by an output; outputs are finite where the truth is (with NaN-poisoned allocations, so
unwritten elements show); finally the calibrated error ratios of :mod:`fk_pytest.compare`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import threading
from typing import Any, Dict, List, Optional, Sequence

import torch

from . import status
from .build import (SENTINEL, clone_inputs, draw_inputs, instantiate, instantiate_candidate, master_state,
                    poisoned_allocations, sentinel_allocations, synchronize, upcast_inputs, with_paths)
from .compare import (OutputError, check_discriminating, check_reference_errors, output_error, reference_error,
                      reference_suspect, triton_interpreter_active)
from .errors import CandidateError, TaskDefinitionError, short_traceback
from .guards import ReferenceTracer, new_threads, tampered
from .phases import phase
from .task import Case, Task, tp_degree


@dataclasses.dataclass
class CaseResult:
    case_id: str
    kind: str  # "workload" or "fuzz"
    seed: int
    status: str
    message: str = ""
    errors: List[OutputError] = dataclasses.field(default_factory=list)
    case: Optional[dict] = None
    delegated: List[str] = dataclasses.field(default_factory=list)  # reference code it ran
    swapped: List[str] = dataclasses.field(default_factory=list)  # candidate classes in the module
    failed: Dict[str, str] = dataclasses.field(default_factory=dict)  # candidate class -> why it failed
    excluded: Dict[str, float] = dataclasses.field(default_factory=dict)  # output -> share of rows left out
    phases: Dict[str, float] = dataclasses.field(default_factory=dict)  # seconds per phase (fk_pytest.phases)
    reference: str = "run"  # where the reference's side came from: "run" or "cache" (fk_pytest.ref_cache)

    @property
    def passed(self) -> bool:
        return self.status == status.PASSED

    def as_json(self) -> dict:
        worst = max(self.errors, key=lambda e: e.ratio, default=None)
        return {"case": self.case_id, "kind": self.kind, "seed": self.seed, "status": self.status,
                "message": self.message, "ratio": worst.ratio if worst else None,
                "outputs": [dataclasses.asdict(e) for e in self.errors], "delegated": self.delegated,
                "swapped": self.swapped, "failed_classes": self.failed, "reference": self.reference,
                **({"excluded_share": self.excluded} if self.excluded else {}),
                **({"params": self.case} if self.kind == "fuzz" else {})}


def as_outputs(result: Any, names: Sequence[str], who: str) -> List[torch.Tensor]:
    outs = [result] if isinstance(result, torch.Tensor) else result
    if not isinstance(outs, (tuple, list)) or len(outs) != len(names) or not all(
            isinstance(o, torch.Tensor) for o in outs):
        raise CandidateError(status.WRONG_OUTPUTS,
                             f"{who} returned {_describe(result)}; expected {len(names)} tensor(s) "
                             f"({', '.join(names)})")
    return list(outs)


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"a tensor {tuple(x.shape)}"
    if isinstance(x, (tuple, list)):
        return f"a {type(x).__name__} of {len(x)}: ({', '.join(_describe(v) for v in x)})"
    return type(x).__name__


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def evaluate_case(task: Task, case: Case, seed: int, candidate_cls: type, device,
                  kind: str = "workload", history: Optional[Dict[str, str]] = None,
                  trace_reference: bool = False, compose=None, cache=None) -> CaseResult:
    """Verdict of ``candidate_cls`` on one case and one input draw.

    ``history`` (digest of earlier candidate outputs -> label) lets a caller that evaluates many
    cases in one process catch replayed outputs; ``trace_reference`` records delegation to the
    reference's code (costly under the Triton interpreter, so callers choose when); ``cache`` (a
    :class:`fk_pytest.ref_cache.ReferenceCache`) holds the reference's side of earlier runs.
    """
    if tp_degree(case) > 1:  # the candidate on several ranks (fk_pytest.tp_eval)
        from .tp_eval import evaluate_tp_case
        return evaluate_tp_case(task, case, seed, candidate_cls, device, kind, history, compose)
    device = torch.device(device)
    names = task.output_names(case)
    written = task.inplace_outputs(case)  # inputs whose post-call state is also compared
    result = CaseResult(case.id, kind, seed, status.PASSED,
                        case=dict(case.params, dtype=str(case.dtype)) if kind == "fuzz" else None)
    with torch.no_grad():
        try:  # everything before the candidate runs is the task's doing, not the candidate's
            with phase("build", device):
                state = master_state(task, case, seed, device)
            entry = CachedCase(cache, task, case, seed, kind, device) if cache is not None else None
            inputs, truths, excluded, draw, ran = _truth_run(task, case, seed, state, device, names, written, entry)
            if entry is not None and not entry.matches(truths) and entry.rows_used:
                # A stale entry: the undetermined rows it gave are not this truth's either.
                inputs, truths, excluded, draw, ran = _truth_run(task, case, seed, state, device, names, written)
            for name, t in zip(names + written, truths):
                check_discriminating(name, t)
            ref_side = _reference_side(task, case, state, device, names + written, inputs, truths, excluded,
                                       draw, entry, ran)
            result.excluded = {n: float(m.float().mean()) for n, m in excluded.items()}
            result.reference = ref_side.source
        except TaskDefinitionError:
            raise
        except Exception as exc:
            raise TaskDefinitionError(f"the task failed before the candidate ran: {short_traceback(exc)}") from exc

        threads_before = {t.ident for t in threading.enumerate()}
        tracer = ReferenceTracer(trace_reference, task.module_path)
        try:
            with phase("build", device):
                candidate = instantiate_candidate(candidate_cls, task, case, state, device, case.dtype, compose)
            result.swapped = list(candidate.fk_composition.swapped)
            cand_inputs = clone_inputs(inputs)
            with phase("candidate"), poisoned_allocations(), interpreted_launches(candidate) as launches, tracer:
                raw = task.call(candidate, cand_inputs)
                # Snapshot in stream order, before any synchronisation: work the candidate left
                # running elsewhere (another stream, a thread) has not landed in it yet.
                snapshot = [o.clone() if isinstance(o, torch.Tensor) else o
                            for o in ([raw] if isinstance(raw, torch.Tensor) else
                                      raw if isinstance(raw, (tuple, list)) else [])]
            with phase("candidate"):
                synchronize(device)
        except CandidateError as exc:
            composition = getattr(exc, "composition", None)
            if composition is not None:
                result.swapped, result.failed = list(composition.swapped), dict(composition.failed)
            return dataclasses.replace(result, status=exc.status, message=exc.message)
        except NotImplementedError as exc:  # a path the candidate has not written yet: not a crash
            return dataclasses.replace(result, status=status.NOT_IMPLEMENTED,
                                       message=f"candidate raised {short_traceback(exc)}")
        except Exception as exc:
            return dataclasses.replace(result, status=status.RUNTIME_ERROR,
                                       message=f"candidate raised: {short_traceback(exc)}")
        result.delegated = sorted(tracer.hits)
        problem = _sterility_problem(threads_before, raw, snapshot)
        if problem is not None:
            result.status, result.message = problem
            return result
        try:
            cands = as_outputs(raw, names, candidate_cls.__name__) + [cand_inputs[w] for w in written]
        except CandidateError as exc:
            return dataclasses.replace(result, status=exc.status, message=exc.message)

        with phase("compare", device):
            return _compare(task, case, seed, device, result, names + written, inputs, cand_inputs, ref_side,
                            cands, truths, excluded, candidate, state, launches, history)


@dataclasses.dataclass
class ReferenceSide:
    """What a verdict needs of the reference: per output its (shape, dtype, device) and its
    (L2, element) errors against the truth on the scored rows; ``source``: "run" or "cache";
    ``module``: the reference built at the case dtype, when it ran."""
    meta: List[tuple]
    errors: List[tuple]
    source: str
    module: Optional[torch.nn.Module] = None


class CachedCase:
    """One case's entry in the reference cache (:mod:`fk_pytest.ref_cache`), read once: the
    reference's errors and, for tasks that leave undetermined rows out, which rows and which input
    draw (finding them runs the reference at the case dtype: for an MoE model, a second model)."""

    def __init__(self, cache, task, case, seed, kind, device):
        from . import ref_cache
        self.cache, self.key = cache, ref_cache.case_key(task, case, seed, kind, device)
        self.payload = cache.load(self.key)
        self.rows_used = False  # whether the truth run took its draw and rows from this entry

    def rows(self):
        """(input draw, {output: excluded-row mask}) stored with the entry, or None."""
        from . import ref_cache
        if self.payload is None or "draw" not in self.payload:
            return None
        self.rows_used = True
        excluded = self.payload.get("excluded", {})
        return self.payload["draw"], {n: ref_cache.unpack_rows(m) for n, m in excluded.items()}

    def matches(self, truths) -> bool:
        """Whether the entry was measured against these truths; a stale one is reported and dropped
        (the reference then runs, and its side replaces the entry)."""
        from . import ref_cache
        if self.payload is None:
            return True
        if (ref_cache.same_truth(self.payload["truth"], ref_cache.truth_fingerprint(truths))
                and len(self.payload["outputs"]) == len(truths)):
            return True
        self.cache.stale(self.key, "the recomputed truth is not the one it was measured against")
        self.payload = None
        return False


def _reference_side(task, case, state, device, names, inputs, truths, excluded, draw, entry,
                    ran=None) -> ReferenceSide:
    """The reference's side of one case: from the reference cache when it holds this case (its
    entry checked against the truth by :meth:`CachedCase.matches`), else from the reference's run
    beside the truth (``ran``: its module and outputs) or a run of it now (stored in the cache,
    when there is one)."""
    from . import ref_cache
    cached = entry is not None and entry.payload is not None
    if cached and reference_suspect([(o["e_ref"], o["elem_ref"]) for o in entry.payload["outputs"]]):
        cached = False  # a suspect error is checked against the native form, which needs the reference run
    if cached:
        entry.cache.hit()
        outputs = entry.payload["outputs"]
        meta = [(tuple(o["shape"]), getattr(torch, o["dtype"]), t.device) for o, t in zip(outputs, truths)]
        return ReferenceSide(meta, [(o["e_ref"], o["elem_ref"]) for o in outputs], "cache")
    if ran is None:
        with phase("build", device):
            reference = instantiate(task.reference, task, case, state, device, case.dtype)
        ran = (reference, _run_reference(task, case, reference, inputs, device))
    reference, refs = ran
    errors = reference_errors(names, truths, refs, excluded)
    if reference_suspect(errors):  # before the cache keeps them
        natives = _run_reference(task, case, reference, inputs, device, method="forward_native")
        check_reference_errors(names, errors, reference_errors(names, truths, natives, excluded))
    side = ReferenceSide([(tuple(r.shape), r.dtype, r.device) for r in refs], errors, "run", reference)
    if entry is not None:
        entry.cache.store(entry.key, {"truth": ref_cache.truth_fingerprint(truths), "draw": draw, "outputs": [
            {"name": n, "shape": list(m[0]), "dtype": str(m[1]).replace("torch.", ""), "e_ref": e, "elem_ref": el}
            for n, m, (e, el) in zip(names, side.meta, errors)],
            "excluded": {n: ref_cache.pack_rows(m) for n, m in excluded.items()}})
    return side


def _compare(task, case, seed, device, result, names, inputs, cand_inputs, ref_side, cands, truths, excluded,
             candidate, state, launches, history, twins: Optional[List[List[torch.Tensor]]] = None) -> CaseResult:
    """The checks after the candidate ran, in order; the first failure names the status. ``twins``:
    the reference's interpreted-Triton outputs when the caller ran them (tensor-parallel ranks)."""
    written = task.inplace_outputs(case)
    problem = _structural_problem(task.mutable_inputs(case), names, inputs, cand_inputs, ref_side.meta, cands)
    if problem is None:
        problem = _nonfinite_problem(task, case, names, cands, truths, candidate, inputs, device)
    if problem is None:
        problem = _constant_problem(names, cands, truths)
    if problem is not None:
        result.status, result.message = problem
        return result

    interpreted = bool(launches["n"]) and _interpreted_triton(case, device)
    truncating = interpreted and case.dtype == torch.bfloat16
    given = twins is not None
    twins = list(twins or [])  # the reference run another way, as the candidate's kernels ran
    kept = [excluded.get(n) for n in names]  # routing-aware: undetermined rows left out

    def scored():
        return [output_error(n, _kept(truths[i], kept[i]), [_kept(r[i], kept[i]) for r in twins],
                             _kept(cands[i], kept[i]), case.dtype, truncating, ref_errors=ref_side.errors[i])
                for i, n in enumerate(names)]

    result.errors = scored()
    if interpreted and not given and any(not e.passed(task.limit) for e in result.errors):
        # The reference with the classes whose candidate modules launched interpreted kernels
        # on their own Triton paths (the task's class itself at L1, children at L2..L4): the
        # error of running the way those kernels ran (the interpreter's truncating bf16
        # conversions, its float32 summation order) is the candidate's bar too.
        # A bar is the worst of the reference's errors, so this run can only raise it: it is
        # made only for a candidate over the bar without it (always made, it was a fifth of the
        # README main job's kernel-level time on 2026-12-06: 51.7 of 233 s, the "compare" phase).
        reference = ref_side.module or instantiate(task.reference, task, case, state, device, case.dtype)
        twin = with_paths(reference, "forward_triton", sorted(launches["by_class"]), include_root=True)
        if any(m.__dict__.get("forward") is not None for m in twin.modules()):
            with poisoned_allocations():
                triton_inputs = clone_inputs(inputs)
                twins.append(as_outputs(task.call(twin, triton_inputs), task.output_names(case), "reference")
                             + [triton_inputs[w] for w in written])
            result.errors = scored()
    digest, label = _digest(cands), f"[{case.id}, seed {seed}]"
    bad = [e for e in result.errors if not e.passed(task.limit)]
    earlier = history.get(digest) if history is not None else None
    # Inputs are a function of (case, seed): the same label again (hypothesis may draw one
    # example twice) is the same inputs, so the same output is no replay.
    if bad and earlier is not None and earlier != label:
        result.status = status.REPLAYED_OUTPUT
        result.message = (f"returned exactly the output it gave for {earlier} although the "
                          "inputs are new: outputs are replayed, not computed")
    elif bad:
        e = bad[0]
        result.status = status.WRONG_RESULT
        result.message = (
            f"output {e.name!r}: relative L2 error {e.e_cand:.3g} is {e.ratio:.2f}x the bar "
            f"max(reference {e.e_ref:.3g}, floor {e.floor:.3g}) (limit {task.limit}); "
            f"max element error {e.elem_cand:.3g} is {e.elem_ratio:.2f}x its bar"
            + _exclusion_note(result.excluded))
    if history is not None:
        history.setdefault(digest, label)
    return result


EXCLUSION_SEED_STEP = 1_000_003  # a redraw's seed: far from the seeds a run uses


def _truth_run(task, case, seed, state, device, names, written, entry=None):
    """Inputs, float64 truths, the task's undetermined rows (``Task.undetermined_rows``), the input
    draw they came from and, unless the reference cache holds this case, the reference's run on
    that draw (its module at the case dtype and its outputs).

    The reference runs beside the truth, on the same draw, because the rule for undetermined rows
    may watch it (an MoE task compares the router logits the reference computes with the truth's);
    its outputs are then the reference side of the verdict, so it runs once per draw, not once for
    the rule and again for the verdict.

    A draw that leaves out more than ``task.max_excluded_share`` of an output's rows is redrawn
    (the weights stay); when every redraw does too, the case cannot be scored: a task error. With a
    reference-cache ``entry`` that stored them, the draw and the rows come from it (the truth is
    computed all the same, and checked against the entry's afterwards).
    """
    known = entry.rows() if entry is not None else None
    if known is not None:
        attempt, masks = known
        inputs, truths, _, _ = _draw_truth(task, case, seed + attempt * EXCLUSION_SEED_STEP, state, device, names,
                                           written, observe=False)
        return inputs, truths, {n: m.to(device) for n, m in masks.items()}, attempt, None
    reference = None
    if entry is None or entry.payload is None:  # the cache will not give the reference's side
        with phase("build", device):
            reference = instantiate(task.reference, task, case, state, device, case.dtype)
    shares = []
    for attempt in range(task.exclusion_redraws + 1):
        inputs, truths, masks, refs = _draw_truth(task, case, seed + attempt * EXCLUSION_SEED_STEP, state, device,
                                                  names, written, observe=True, reference=reference)
        worst = max((float(m.float().mean()) for m in masks.values()), default=0.0)
        if worst <= task.max_excluded_share and worst < 1.0:  # something must be left to score
            return inputs, truths, masks, attempt, (reference, refs) if reference is not None else None
        shares.append(worst)
    raise TaskDefinitionError(
        f"every input draw leaves too many rows undetermined at {case.dtype} (excluded shares "
        f"{', '.join(f'{s:.0%}' for s in shares)} > cap {task.max_excluded_share:.0%}): the case cannot be scored")


def _draw_truth(task, case, draw_seed, state, device, names, written, observe: bool, reference=None):
    """One input draw and its float64 truths; with ``observe``, the task's undetermined rows too;
    with a ``reference`` module, its outputs on the draw (else None)."""
    with phase("inputs", device):
        inputs = draw_inputs(task, case, device, [draw_seed])[0]
    refs = None
    with phase("truth", device):
        truth_module = instantiate(task.reference, task, case, state, device, torch.float64)
        truth_inputs = upcast_inputs(inputs)
        observed = task.undetermined_rows(case, truth_inputs, truth_module, reference) if observe else None
        if reference is not None:
            refs = _run_reference(task, case, reference, inputs, device)
        truths = as_outputs(task.call(truth_module, truth_inputs, "forward_native"), names, "truth") \
            + [truth_inputs[w] for w in written]
        masks = {n: m for n, m in (observed() if observed is not None else {}).items() if m is not None}
    return inputs, truths, masks, refs


def _run_reference(task, case, reference, inputs, device, method: Optional[str] = None) -> List[torch.Tensor]:
    """The reference's outputs (then its in-place outputs) on a copy of ``inputs``, in poisoned
    allocations like the candidate's; ``method``: another method than ``forward``."""
    with phase("reference", device), poisoned_allocations():
        ref_inputs = clone_inputs(inputs)
        refs = (as_outputs(task.call(reference, ref_inputs, method), task.output_names(case), "reference")
                + [ref_inputs[w] for w in task.inplace_outputs(case)])
    synchronize(device)
    return refs


def reference_errors(names, truths, outs, excluded) -> List[tuple]:
    """(L2, element) errors of the reference's ``outs`` against the truths, on the scored rows."""
    return [reference_error(_kept(t, excluded.get(n)), _kept(r, excluded.get(n))) for n, t, r in zip(names, truths, outs)]


def _kept(t: torch.Tensor, excluded: Optional[torch.Tensor]) -> torch.Tensor:
    """``t`` without the excluded rows (mask over its leading dimensions), flattened to rows."""
    if excluded is None:
        return t
    return t[~excluded.to(t.device)]


def _exclusion_note(excluded: Dict[str, float]) -> str:
    if not excluded:
        return ""
    return " (undetermined rows left out: " + ", ".join(f"{n} {s:.0%}" for n, s in excluded.items()) + ")"


def _digest(tensors: Sequence[torch.Tensor]) -> str:
    """A fingerprint of the outputs' bytes, computed where they are: a replayed output has the same
    bytes, so the same fingerprint. (Hashing on the host copied every output off the GPU: a
    prefill's 134 MB norm output cost ~0.1 s a case, most of rms_norm's compare phase.) Two
    weighted sums of the 32-bit words, the weights a fixed function of the position; integer
    sums wrap, which keeps them exact and deterministic."""
    h = hashlib.sha256()
    for t in tensors:
        data = t.detach().contiguous().view(-1).view(torch.uint8)
        h.update(f"{tuple(t.shape)}{t.dtype}{data.numel()}".encode())
        pad = (-data.numel()) % 4
        if pad:
            data = torch.cat([data, data.new_zeros(pad)])
        words = data.view(torch.int32).to(torch.int64)
        position = torch.arange(words.numel(), device=words.device, dtype=torch.int64)
        for a, b in ((0x9E3779B1, 0x7F4A7C15), (0x85EBCA77, 0x165667B1)):
            h.update(int((words * (position * a + b)).sum()).to_bytes(8, "little", signed=True))
    return h.hexdigest()


def _sterility_problem(threads_before, raw, snapshot):
    names = tampered()
    if names:
        return status.TAMPERED, f"candidate code replaced {', '.join(names[:5])}"
    threads = new_threads(threads_before)
    if threads:
        return status.WORK_ESCAPED, (f"candidate left thread(s) {', '.join(threads)} running after it "
                                     "returned: work the timer cannot see")
    outs = [raw] if isinstance(raw, torch.Tensor) else raw if isinstance(raw, (tuple, list)) else []
    for i, (now, then) in enumerate(zip(outs, snapshot)):
        if isinstance(now, torch.Tensor) and not torch.equal(now.nan_to_num(), then.nan_to_num()):
            return status.WORK_ESCAPED, (f"output {i} changed after the call returned: the work ran on "
                                         "another CUDA stream or thread, outside the timed stream")
    return None


def _constant_problem(names, cands, truths):
    for name, c, t in zip(names, cands, truths):
        if c.is_floating_point() and c.numel() > 1 and float(c.double().std()) == 0.0:
            value = float(c.reshape(-1)[0])
            return status.CONSTANT_OUTPUT, f"output {name!r} is the constant {value:g} where the truth varies"
    return None


@contextlib.contextmanager
def interpreted_launches(root: Optional[torch.nn.Module] = None):
    """Count Triton kernels launched through the CPU interpreter while the block runs.

    Only a candidate that really ran interpreted Triton kernels gets the interpreter-aware bf16 bar
    (see :mod:`fk_pytest.compare`); a PyTorch candidate is held to the native reference's error.
    With ``root``, launches are also attributed to the class of the innermost module of ``root``
    running at the time (``counter["by_class"]``), so the end-to-end noise run can interpret
    exactly those classes.
    """
    counter = {"n": 0, "by_class": {}}
    if not triton_interpreter_active():
        yield counter
        return
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except Exception:  # no Triton, or its internals moved: count nothing, stay strict
        yield counter
        return
    original = InterpretedFunction.run
    running: List[str] = []

    def counting_run(self, *args, **kwargs):
        counter["n"] += 1
        if running:
            counter["by_class"][running[-1]] = counter["by_class"].get(running[-1], 0) + 1
        return original(self, *args, **kwargs)

    def enter(mod, args):
        running.append(type(mod).__name__)

    def leave(mod, args, out):  # returns None: a forward hook's return value replaces the output
        running.pop()

    handles = []
    for m in (root.modules() if root is not None else ()):
        handles += [m.register_forward_pre_hook(enter), m.register_forward_hook(leave)]
    InterpretedFunction.run = counting_run
    try:
        yield counter
    finally:
        InterpretedFunction.run = original
        for h in handles:
            h.remove()


def _interpreted_triton(case, device) -> bool:
    """On the CPU under Triton's interpreter, the bars of bf16 and float32 cases also count the
    reference's own Triton path, run as the candidate's kernels ran. bf16: the interpreter's
    conversions truncate (see :mod:`fk_pytest.compare`). float32: the interpreter sums in NumPy's
    order where torch's CPU kernels sum in theirs, and a model several layers deep carries that
    last-bit difference far: an honest tree of interpreted kernels measured 0.8-2.6x the native
    reference's error on the Qwen3-Next L4 fuzz cases (2026-12-06, an AMD EPYC CPU; under 2x on
    the machines before), where a wrong kernel is orders of magnitude off."""
    return case.dtype in (torch.bfloat16, torch.float32) and device.type == "cpu" and triton_interpreter_active()


def _structural_problem(mutable, names, inputs, cand_inputs, ref_meta, cands):
    for name, (shape, dtype, where), c in zip(names, ref_meta, cands):
        if tuple(c.shape) != tuple(shape):
            return status.WRONG_SHAPE, f"output {name!r} has shape {tuple(c.shape)}, expected {tuple(shape)}"
        if c.dtype != dtype:
            return status.WRONG_DTYPE, f"output {name!r} has dtype {c.dtype}, expected {dtype}"
        if c.device != where:
            return status.WRONG_OUTPUTS, f"output {name!r} is on {c.device}, expected {where}"
    protected = {k: v for k, v in cand_inputs.items()
                 if isinstance(v, torch.Tensor) and k not in mutable}
    for name, c in zip(names, cands):
        for k, v in protected.items():
            if c.numel() and v.numel() and _storage(c) == _storage(v):
                return status.OUTPUT_ALIASES_INPUT, f"output {name!r} shares memory with input {k!r}"
    for k, v in protected.items():
        if not torch.equal(v, inputs[k]):
            return status.INPUT_MUTATED, f"input {k!r} was modified; this op must leave it unchanged"
    return None


def _nonfinite_problem(task, case, names, cands, truths, candidate, inputs, device):
    for i, (name, c, t) in enumerate(zip(names, cands, truths)):
        if not c.is_floating_point():
            continue
        bad = ~torch.isfinite(c) & torch.isfinite(t)
        if not bool(bad.any()):
            continue
        count, total = int(bad.sum()), c.numel()
        # Run again with a finite sentinel in fresh allocations: elements that are NaN under the
        # NaN poison and hold the sentinel now were never written by the candidate.
        try:
            with sentinel_allocations():
                rerun_inputs = clone_inputs(inputs)
                rerun = (as_outputs(task.call(candidate, rerun_inputs), task.output_names(case), "candidate")
                         + [rerun_inputs[w] for w in task.inplace_outputs(case)])[i]
            synchronize(device)
            unwritten = int((bad & (rerun == SENTINEL)).sum())
        except Exception:
            unwritten = 0
        if unwritten:
            return (status.UNWRITTEN_OUTPUT,
                    f"output {name!r}: {unwritten} of {total} elements were never written "
                    "(they kept the poison of freshly allocated memory)")
        return status.NONFINITE_OUTPUT, f"output {name!r}: {count} of {total} elements are NaN/Inf where the truth is finite"
    return None
