"""The end-to-end level at tensor-parallel degree > 1 (a case's ``tp`` param above 1): the
candidate model served by the engine on ``tp`` rank processes (``kernels_reference.engine.
tensor_parallel``: the scheduler on rank 0, every rank its shard and its KV heads), so a tree's
communication inside its layers (the all-reduces after row-parallel layers and expert blocks, the
vocabulary-parallel embedding and head) is scored in a served model, on both scoring paths.

What the candidate is judged against does not change: the degree-1 reference's calibration of
the same (model, scenario), its noise runs, floors and mutants. A reference at degree 2 sums its
partial products in another order, which is within the re-batched noise runs' floor (a copy of the
reference gets credit 1.00, tests/test_e2e_tp.py).

Each rank builds the spec's architecture inside its tensor-parallel state (the layers allocate
their shards), loads its cut of the reference's full weights (``tp_eval.shard_state``), composes
the tree's classes in (built at the rank's degree too) and serves the scenario; rank 0 returns the
top-1 predictions. On CPUs the ranks join over gloo; a GPU run needs one device per rank.
"""
from __future__ import annotations

from typing import Dict, Optional

import torch

from .errors import CandidateError
from .task import tp_degree
from .tp_ranks import RankFailure, run_ranks

RANK_TIMEOUT_S = 600.0  # one group run: start, build, both scoring paths of the scenario


def candidate_at_degree(spec, case, reference: torch.nn.Module, tree: Optional[str], run, args: dict) -> dict:
    """``{"top1": {path: predictions}, "steps": {path: {kind: n}}, "swapped": [...],
    "interpreted_classes": [...]}`` of the tree composed into the model at the case's degree
    (``tree`` None: the reference itself). A rank that fails ends the case as the candidate's
    failure, naming the rank."""
    tp = tp_degree(case)
    payload = {"spec": spec, "case": case, "tree": tree, "run": run, "args": args,
               "state": {k: v.detach().cpu() for k, v in reference.state_dict().items()}}
    try:
        return run_ranks(_rank_job, tp, payload, RANK_TIMEOUT_S)[0]
    except RankFailure as exc:
        raise CandidateError(exc.status, f"at tensor-parallel degree {tp}: {exc.message}") from exc


def _rank_job(rank: int, tp: int, payload: dict):
    from kernels_reference.engine.tensor_parallel import serve_rank

    from .candidates import CandidateSource
    from .compose import candidate_lookup, swap_children
    from .correctness import interpreted_launches
    from .e2e import PATHS
    from .e2e_run import engine_model, forced_counting_steps
    from .tp_eval import shard_state

    spec, case = payload["spec"], payload["case"]
    built: Dict[str, object] = {}

    def make_model():  # inside this rank's tensor-parallel state: the layers allocate their shards
        arch = spec.build_architecture(case, torch.device("cpu")).to(case.dtype).eval()
        arch.load_state_dict(shard_state(arch, payload["state"]), strict=True)
        holder = torch.nn.Module()
        holder.model = arch
        swapped = []
        if payload["tree"] is not None:
            composition = swap_children(holder, candidate_lookup(CandidateSource(payload["tree"])))
            composition.raise_if_failed()
            swapped = list(composition.swapped)
        built.update(model=holder.model, swapped=swapped)
        return engine_model(holder.model, arch)

    def work(llm):
        top1, steps = {}, {}
        with interpreted_launches(built["model"]) as launches:
            for path in PATHS:
                top1[path], steps[path] = forced_counting_steps(llm, payload["run"], path)
        return {"top1": top1, "steps": steps, "swapped": built["swapped"],
                "interpreted_classes": sorted(launches["by_class"])}

    return serve_rank(rank, tp, None, make_model, payload["args"], work)
