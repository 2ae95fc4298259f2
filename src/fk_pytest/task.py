"""The task contract: what a task module declares, and nothing more.

A task subclasses :class:`Task` and says which reference module it scores, how to build that module
from a real model config, which inputs a workload case feeds it, how to fuzz shapes around the real
ones and how many bytes/FLOPs a case moves. The standard tests (correctness, fuzz, speed) are
written once in :mod:`fk_pytest.standard_tests` and attached with one line per task module.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

DTYPES: Dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


@dataclasses.dataclass(frozen=True)
class Case:
    """One workload case: a shape/dtype/variant a real model runs, with how often it runs."""

    id: str  # readable and stable; becomes the pytest parameter id
    dtype: torch.dtype
    params: Mapping[str, Any]
    model: Optional[str] = None
    weight: float = 1.0  # relative frequency in the workload (geomean weight)

    def __str__(self) -> str:
        return self.id

    def __getitem__(self, key: str) -> Any:
        return self.params[key]

    def as_json(self) -> dict:
        return {"id": self.id, "dtype": DTYPE_NAMES.get(self.dtype, str(self.dtype)),
                "model": self.model, "weight": self.weight, "params": dict(self.params)}


def tp_degree(case: "Case") -> int:
    """The tensor-parallel degree a case runs at (its ``tp`` param; 1 when it has none)."""
    return int(case.params.get("tp", 1))


def at_degree(case: "Case", tp: int) -> "Case":
    """``case`` again at tensor-parallel degree ``tp`` (its id suffixed ``-tp<tp>``)."""
    return Case(f"{case.id}-tp{tp}", case.dtype, model=case.model, weight=case.weight, params=dict(case.params, tp=tp))


def degree_one_id(case: "Case") -> str:
    """The id of ``case`` at degree 1 (``at_degree``'s suffix taken off again)."""
    suffix = f"-tp{tp_degree(case)}"
    return case.id[: -len(suffix)] if tp_degree(case) > 1 and case.id.endswith(suffix) else case.id


class RanksDisagree(Exception):
    """Tensor-parallel ranks hold different results where each must hold the whole one."""


class Task:
    """Base class of every task. Subclasses set the class attributes and override the hooks."""

    name: str = ""  # e.g. "rms_norm"
    level: int = 1
    family: str = ""  # MacroEval's unit, e.g. "norm"
    module_path: str = ""  # path under kernels_reference / a candidate tree, e.g. "L1/rms_norm.py"
    reference: type = None  # the reference nn.Module class; its name is the candidate's class name
    limit: float = 2.0  # calibrated ratio a case must stay within
    may_mutate: Tuple[str, ...] = ()  # inputs the op may write in place (production does)
    seeds: int = 2  # input draws per case
    # Routing-aware correctness (see ``undetermined_rows``): the largest share of an output's rows
    # that may be excluded before a draw is refused; refused draws are redrawn up to
    # ``exclusion_redraws`` times (a one-token decode case is all or nothing), then it is a task error.
    max_excluded_share: float = 0.5
    exclusion_redraws: int = 3

    @property
    def class_name(self) -> str:
        return self.reference.__name__

    # ---- hooks a task implements ----------------------------------------------------------------
    def cases(self, profile: str) -> Sequence[Case]:
        raise NotImplementedError

    def init_args(self, case: Case) -> Dict[str, Any]:
        raise NotImplementedError

    def init_weights(self, module: torch.nn.Module, gen: torch.Generator) -> None:
        """Fill parameters with realistic values (never the constructor's ones/zeros)."""
        with torch.no_grad():
            for p in module.parameters():
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen, device=p.device))

    def make_inputs(self, case: Case, gen: torch.Generator, device: torch.device) -> Dict[str, Any]:
        raise NotImplementedError

    def output_names(self, case: Case) -> Tuple[str, ...]:
        return ("out",)

    def call(self, module: torch.nn.Module, inputs: Dict[str, Any], method: Optional[str] = None):
        """Run ``module`` (or its ``method``, e.g. ``forward_native``) on one input set.

        Tasks whose modules read state production passes outside the arguments (the attention
        metadata in the forward context, the layer's bound KV cache) set it up here.
        """
        fn = getattr(module, method) if method else module
        return fn(**inputs)

    def undetermined_rows(self, case: Case, inputs: Dict[str, Any], truth_module: torch.nn.Module,
                          reference: Optional[torch.nn.Module] = None):
        """Rows of the outputs whose result the case dtype does not determine (default: none).

        Called with the float64 truth module and its inputs *before* the truth runs, so the task can
        observe it (e.g. record the router logits a MoE layer sees), and with the ``reference`` at
        the case dtype that the caller runs on the same inputs before the truth (None: the caller
        does not run it, and a rule that needs it runs its own); returns ``None`` or a callable
        that, after both ran, gives ``{output name: bool mask}`` (the mask covers the output's
        leading dimensions; True = excluded). Excluded rows are dropped from the truth, the
        reference and the candidate alike. Example: a MoE token whose k-th and (k+1)-th router
        logits are within rounding of each other may honestly go to either expert, and its output
        then differs by O(1) (``tasks/moe.py``).
        """
        return None

    def inplace_outputs(self, case: Case) -> Tuple[str, ...]:
        """Inputs whose state after the call is an output (e.g. the KV cache a layer writes)."""
        return ()

    # ---- tensor parallelism (cases with a "tp" param above 1; fk_pytest.tp_eval) ----------------
    def rank_inputs(self, inputs: Dict[str, Any], case: Case, rank: int, tp: int) -> Dict[str, Any]:
        """What rank ``rank`` of ``tp`` is called with (default: the whole inputs, as a replicated
        activation is). A row-parallel layer gets its slice of the input features."""
        return inputs

    def assemble_ranks(self, outputs: List[List[torch.Tensor]], case: Case) -> List[torch.Tensor]:
        """The degree-1 outputs from each rank's (default: every rank holds the whole result, as
        after an all-reduce: rank 0's, once every rank is checked to hold the same). A
        :class:`RanksDisagree` names the first rank that does not."""
        for rank, outs in enumerate(outputs[1:], start=1):
            for i, (a, b) in enumerate(zip(outputs[0], outs)):
                if a.shape != b.shape or not torch.equal(a, b):
                    raise RanksDisagree(f"output {self.output_names(case)[i]!r} of rank {rank} differs from rank 0's "
                                        "although every rank must hold the whole result (a missing or partial "
                                        "all-reduce)")
        return outputs[0]

    def mutable_inputs(self, case: Case) -> Tuple[str, ...]:
        """Inputs this case may write in place; every other input must come back unchanged."""
        return self.may_mutate

    def fuzz_strategy(self, dtype: torch.dtype, profile: str):
        """A hypothesis strategy of Cases around the real shapes (other real widths, odd counts)."""
        raise NotImplementedError

    def l2_hot(self, case: Case) -> bool:
        """Whether production finds this case's inputs in L2 (then the amortised timing repeats
        one input set instead of rotating K of them; see fk_pytest.timing)."""
        return False

    def io_bytes(self, case: Case) -> int:
        """Fewest bytes the op must move: every input read once, every output written once."""
        return 0

    def flops(self, case: Case) -> int:
        return 0

    def __repr__(self) -> str:
        return f"<Task {self.name} L{self.level} {self.family}>"
