"""A case at tensor-parallel degree ``tp`` (its ``tp`` param above 1): the reference and the candidate
run on ``tp`` ranks (:mod:`fk_pytest.tp_ranks`), one after the other in one group run, and the result the ranks hold together is
judged against the degree-1 float64 truth like any output.

Per rank the module is built inside the rank's group (a layer reads the degree and its rank when
built, as vLLM's do) and given its part of the case's full weights, cut as the reference's layers
cut a checkpoint (``shard_checkpoint``): the reference's shard layout is the contract, so a
candidate's parameters must have the reference's per-rank shapes. Each rank is called with
``Task.rank_inputs`` (a row-parallel layer's slice of the input features); ``Task.assemble_ranks``
puts the ranks' outputs back together (rank 0's after an all-reduce, once every rank is checked to
hold the same). The reference's own error at the same degree is the bar, as at degree 1, and the
checks after the run are the usual ones (:func:`fk_pytest.correctness._compare`).
"""
from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Dict, Optional

import torch

from . import status
from .build import clone_inputs, master_state, with_paths
from .correctness import (CaseResult, ReferenceSide, _compare, _interpreted_triton, _truth_run, as_outputs,
                          interpreted_launches, reference_errors)
from .errors import CandidateError, TaskDefinitionError, short_traceback
from .phases import phase
from .task import RanksDisagree, Task, tp_degree
from .tp_ranks import RankFailure, run_ranks

RANK_TIMEOUT_S = 120.0  # a whole group's run of one case (the ranks start, build and call once)


def shard_state(module: torch.nn.Module, state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """``state`` (full, degree-1 tensors by parameter name) cut to what ``module`` (built at this
    rank's degree) holds: each parameter by its owning layer's ``shard_checkpoint``, else whole."""
    out = {}
    for name, tensor in state.items():
        owner_name, _, leaf = name.rpartition(".")
        owner = module.get_submodule(owner_name) if owner_name else module
        cut = getattr(owner, "shard_checkpoint", None)
        out[name] = cut(leaf, tensor) if callable(cut) else tensor
    return out


class ReferenceRankError(Exception):
    """The reference itself failed on a rank: the task's fault, not the candidate's."""


def _rank_job(rank: int, tp: int, payload: dict):
    """One rank's part of a case: the reference, then the candidate (when there is one), each built
    at this rank, given its shard of the weights and called on this rank's inputs. One group run
    serves both, so a case pays for one start of its ranks."""
    from .evaluator import resolve_task

    task: Task = resolve_task(payload["task"])
    case = payload["case"]
    reference = task.reference(**task.init_args(case))  # also the shard layout at this rank
    shard = shard_state(reference, payload["state"])
    try:
        ref_out = _call_at_rank(task, case, reference, shard, payload["inputs"], rank, tp)
    except Exception as exc:
        raise ReferenceRankError(f"the reference failed: {type(exc).__name__}: {exc}") from exc
    if payload["candidate"] is None and payload.get("compose") is None:
        return {"reference": ref_out, "candidate": ref_out}
    from .candidates import CandidateSource
    from .compose import candidate_lookup, swap_children
    from .signatures import construct
    cls = CandidateSource(payload["candidate"]).load_class(task) if payload["candidate"] else task.reference
    module = construct(cls, task.init_args(case), "cpu")
    swapped = []
    if payload.get("compose"):  # composed mode: the tree's classes inside, built at this rank too
        _load_shard(module, shard, case, tp)
        composition = swap_children(module, candidate_lookup(CandidateSource(payload["compose"])))
        composition.raise_if_failed()
        swapped = composition.swapped
    with interpreted_launches(module) as launches:
        cand_out = _call_at_rank(task, case, module, shard, payload["inputs"], rank, tp)
    twin = None
    if launches["n"] and _interpreted_triton(case, torch.device("cpu")):
        # The candidate's Triton kernels ran in the interpreter: its bar is the reference with the
        # same classes on their Triton paths, here at this rank (as correctness._compare does at
        # degree 1), so the all-reduce's rounding is in the bar as it is in the candidate.
        twin_module = with_paths(reference, "forward_triton", sorted(launches["by_class"]), include_root=True)
        twin = _call_at_rank(task, case, twin_module, shard, payload["inputs"], rank, tp)
    return {"reference": ref_out, "candidate": cand_out, "twin": twin, "swapped": swapped}


def _load_shard(module: torch.nn.Module, shard, case, tp: int) -> None:
    module.to(dtype=case.dtype)
    own = module.state_dict()
    for name, tensor in shard.items():
        if name in own and tuple(own[name].shape) != tuple(tensor.shape):
            raise ValueError(f"{type(module).__name__}.{name} is {tuple(own[name].shape)} on this rank where the "
                             f"reference's shard is {tuple(tensor.shape)}: the class does not shard at degree {tp} "
                             "(a layer reads the degree and its rank from kernels_reference.parallel_state when built)")
    module.load_state_dict(shard, strict=True)


def _call_at_rank(task: Task, case, module: torch.nn.Module, shard, inputs, rank: int, tp: int):
    _load_shard(module, shard, case, tp)
    mine = task.rank_inputs(clone_inputs(inputs), case, rank, tp)
    with torch.no_grad():
        out = as_outputs(task.call(module.eval(), mine), task.output_names(case), type(module).__name__)
    # then this rank's part of the inputs the op writes (its KV heads of the cache)
    return [o.detach().cpu() for o in out] + [mine[w].detach().cpu() for w in task.inplace_outputs(case)]


def _candidate_source(cls: type, task: Task) -> str:
    """The candidate tree (or file) ``cls`` was loaded from, for the ranks to load it again."""
    path = Path(inspect.getfile(cls)).resolve()
    parts = Path(task.module_path).parts
    if path.parts[-len(parts):] == parts:
        return str(Path(*path.parts[:-len(parts)]))
    return str(path)


def evaluate_tp_case(task: Task, case, seed: int, candidate_cls: type, device, kind: str = "workload",
                     history: Optional[Dict[str, str]] = None, compose=None) -> CaseResult:
    """Verdict of ``candidate_cls`` at the case's degree (CPU ranks over gloo); ``compose``: the
    composed mode's lookup (``compose.candidate_lookup``), whose tree each rank composes again."""
    device = torch.device(device)
    tp = tp_degree(case)
    names = tuple(task.output_names(case)) + tuple(task.inplace_outputs(case))  # then the inputs written in place
    result = CaseResult(case.id, kind, seed, status.PASSED,
                        case=dict(case.params, dtype=str(case.dtype)) if kind == "fuzz" else None)
    from .evaluator import task_ref
    payload = {"task": task_ref(task), "case": case, "candidate": None}
    with torch.no_grad():
        try:
            with phase("build", device):
                state = master_state(task, case, seed, device)
            inputs, truths, excluded, _, _ = _truth_run(task, case, seed, state, device, task.output_names(case),
                                                        task.inplace_outputs(case))
        except TaskDefinitionError:
            raise
        except Exception as exc:
            raise TaskDefinitionError(f"the task failed before the candidate ran: {short_traceback(exc)}") from exc
        payload.update(state={k: v.detach().cpu() for k, v in state.items()},
                       inputs={k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()})
        if candidate_cls is not task.reference:
            result.swapped = [candidate_cls.__name__]
            payload["candidate"] = _candidate_source(candidate_cls, task)
        if compose is not None:
            payload["compose"] = str(compose.source.path)
        try:
            with phase("candidate"):
                ranks = run_ranks(_rank_job, tp, payload, RANK_TIMEOUT_S)
        except RankFailure as exc:
            if "ReferenceRankError" in exc.message:
                raise TaskDefinitionError(f"at tp={tp}: {exc.message}") from exc
            failure = CandidateError(exc.status, f"at tensor-parallel degree {tp}: {exc.message}")
            return dataclasses.replace(result, status=failure.status, message=failure.message)
        result.swapped += [name for name in ranks[0].get("swapped", []) if name not in result.swapped]
        try:
            refs = task.assemble_ranks([r["reference"] for r in ranks], case)
        except RanksDisagree as exc:
            raise TaskDefinitionError(f"the reference at tp={tp}: {exc}") from exc
        errors = reference_errors(names, truths, refs, excluded)
        ref_side = ReferenceSide([(tuple(r.shape), r.dtype, r.device) for r in refs], errors, "run")
        result.reference = ref_side.source
        try:
            cands = task.assemble_ranks([r["candidate"] for r in ranks], case)
        except RanksDisagree as exc:
            return dataclasses.replace(result, status=status.WRONG_RESULT, message=f"at tp={tp}: {exc}")
        twins = []
        if all(r.get("twin") is not None for r in ranks):
            try:
                twins = [task.assemble_ranks([r["twin"] for r in ranks], case)]
            except RanksDisagree as exc:
                raise TaskDefinitionError(f"the reference's Triton paths at tp={tp}: {exc}") from exc
        with phase("compare", device):
            return _compare(task, case, seed, device, result, list(names), inputs, clone_inputs(inputs), ref_side,
                            cands, truths, excluded, None, state, {"n": len(twins), "by_class": {}}, history,
                            twins=twins)
