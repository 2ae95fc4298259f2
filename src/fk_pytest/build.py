"""Build the modules and inputs of one case: reference, candidate and float64 truth share weights.

Weights are drawn once per case (float32 master copy on the CPU) and loaded *strictly* into every
instance, so a candidate whose parameter names or shapes differ from the reference is refused
before it runs.
"""
from __future__ import annotations

import contextlib
import copy
import gc
import hashlib
import warnings
from typing import Any, Dict, Mapping, Optional, Sequence

import torch

from . import status
from .errors import CandidateError
from .signatures import construct, install_call_checks
from .task import Case, Task


def master_state(task: Task, case: Case, seed: int, device="cpu") -> Dict[str, torch.Tensor]:
    """Weights drawn once per case, in float32, on ``device`` (a GPU draws a 2-layer 8B model's
    1.5 billion values in milliseconds where a CPU takes seconds)."""
    with torch.device(device):
        module = task.reference(**task.init_args(case))
    task.init_weights(module, torch.Generator(device=device).manual_seed(seed))
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def draw_inputs(task: Task, case: Case, device, seeds) -> list:
    """One input set per seed, drawn on ``device`` (timing rotates several; every draw is new data)."""
    device = torch.device(device)
    return [task.make_inputs(case, torch.Generator(device=device).manual_seed(s), device) for s in seeds]


def instantiate(cls: type, task: Task, case: Case, state, device, dtype) -> torch.nn.Module:
    with torch.device(device):  # built where it runs: a full-size layer never stages in host memory
        module = cls(**task.init_args(case))
    module.to(device=device, dtype=dtype)
    # load_state_dict copies into the parameters, casting as it goes: no second full-size copy
    # of the weights at ``dtype`` (a float64 copy of an MoE layer is 11 GB).
    module.load_state_dict(state, strict=True)
    return module.eval()


def instantiate_candidate(cls, task, case, state, device, dtype, compose=None) -> torch.nn.Module:
    """The candidate side: ``cls`` on the shared weights; with ``compose`` (composed mode) its
    reference descendants are then replaced by the candidate tree's classes. What was composed (and
    what failed) is left on the module as ``fk_composition``; a failed class raises its
    CandidateError, carrying the composition as ``.composition``. Calls into candidate classes are
    checked for compatibility as they happen (:mod:`fk_pytest.signatures`)."""
    from .compose import Composition, swap_children

    module = _candidate_module(cls, task, case, state, device, dtype)
    composition = Composition(swapped=[cls.__name__] if cls is not task.reference else [])
    if compose is not None:
        swap_children(module, compose, composition)
    object.__setattr__(module, "fk_composition", composition)
    try:
        composition.raise_if_failed()
    except CandidateError as exc:
        exc.composition = composition
        raise
    return module


def _candidate_module(cls, task, case, state, device, dtype) -> torch.nn.Module:
    module = construct(cls, task.init_args(case), device)  # the constructor is candidate code
    try:
        module.to(device=device, dtype=dtype)
    except Exception as exc:
        raise CandidateError(status.RUNTIME_ERROR, f"{cls.__name__}.to({device}, {dtype}) raised {exc!r}") from exc
    try:
        module.load_state_dict(state, strict=True)
    except torch.OutOfMemoryError:
        raise  # the device is full, not a layout the class got wrong
    except Exception as exc:
        raise CandidateError(
            status.STATE_DICT_MISMATCH,
            f"the reference state_dict does not load strictly into {cls.__name__}: {exc}") from exc
    if cls is not task.reference:
        install_call_checks(module)
    return module.eval()


def copy_model(model: torch.nn.Module, share_parameters: bool = False) -> torch.nn.Module:
    """A deep copy without the KV and state caches an engine bound to the original (each engine
    allocates its own; copying an 8B model's caches would double their memory for nothing).

    ``share_parameters``: the copy holds the original's parameter tensors themselves, for a copy
    that only runs the reference's own code beside it (its other forward paths, a built-in mutant),
    which never writes its weights. A full-size model then costs one set of weights however many
    such copies a calibration makes: Qwen3-Next's eight-layer cut (27 GB) ran out of an H100's
    80 GB on 2026-12-06 while a mutant was copied. A candidate's copy never shares: its code could
    write the weights the reference is judged by."""
    memo = {id(cache): None for m in model.modules() for cache in (getattr(m, "kv_cache", None),
                                                                   getattr(m, "state_cache", None))
            if cache is not None}
    if share_parameters:
        memo.update({id(p): p for p in model.parameters()})
    return copy.deepcopy(model, memo)


def own_parameters(model: torch.nn.Module, others: torch.nn.Module) -> None:
    """Give ``model`` its own copy of every parameter it holds of ``others`` (in place; a parameter
    tied to two places of ``model`` stays tied). :func:`fk_pytest.e2e_run.compose_candidate`
    composes a candidate on a copy that shares the reference's weights, so that a class swapped in
    builds its weights from the reference's without a full copy first, then gives the modules
    left as they were their own."""
    theirs = {id(p) for m in others.modules() for p in m._parameters.values() if p is not None}
    clones: Dict[int, torch.nn.Parameter] = {}
    with torch.no_grad():
        for m in model.modules():
            for name, p in list(m._parameters.items()):
                if p is not None and id(p) in theirs:
                    if id(p) not in clones:
                        clones[id(p)] = torch.nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad)
                    m._parameters[name] = clones[id(p)]


@contextlib.contextmanager
def parameters_registered_at(dtype: Optional[torch.dtype]):
    """While open, a floating-point parameter that any module registers is stored at ``dtype`` at
    once (``None``: left alone); buffers stay as the constructor made them.

    A class swapped into a bf16 model is built at the default float32 and cast afterwards; for the
    model class itself (a tree that provides it, the reference tree included) that built the whole
    model in float32 beside the reference: Mixtral's 8-layer cut, 44 GiB on an H100 on 2026-12-07
    (docs/perf/h100-2026-12-07h.md). Cast as it is registered, each parameter exists in float32
    alone and briefly. The values are the constructor's, later overwritten by the strict load of
    the reference's weights."""
    if dtype is None:
        yield
        return
    from torch.nn.modules.module import register_module_parameter_registration_hook

    def cast(module, name, param):
        # In place, as Module.to casts: the same Parameter object (a subclass and any attributes
        # set on it stay), its float32 storage freed once nothing else holds it.
        if param is not None and param.is_floating_point() and param.dtype != dtype:
            with torch.no_grad():
                param.data = param.data.to(dtype)

    handle = register_module_parameter_registration_hook(cast)
    try:
        yield
    finally:
        handle.remove()


def weights_digest(model: torch.nn.Module, buffers: bool = True) -> str:
    """A digest of a model's weights (and buffers): per tensor its name, shape, dtype, sum and sum
    of squares (read on the device the model lives on: a few ms for an 8B model)."""
    h = hashlib.sha256()
    chunk = 1 << 24  # float64 copies of at most this many elements at a time
    tensors = list(model.named_parameters()) + (list(model.named_buffers()) if buffers else [])
    with torch.no_grad():
        for name, t in tensors:
            flat = t.detach().reshape(-1)
            total = torch.zeros(2, dtype=torch.float64, device=flat.device)
            for start in range(0, flat.numel(), chunk):
                x = flat[start:start + chunk].to(torch.float64)
                total += torch.stack((x.sum(), (x * x).sum()))
            s, q = total.tolist()
            h.update(f"{name}:{tuple(t.shape)}:{t.dtype}:{s:.17g}:{q:.17g}".encode())
    return h.hexdigest()


def cast_copy(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A deep copy with floating-point parameters and buffers at ``dtype``, made without first
    copying them at their own precision (``deepcopy(m).to(dtype)`` briefly holds a second float64
    model)."""
    memo = {}
    for t in list(model.parameters()) + list(model.buffers()):
        if t.is_floating_point() and id(t) not in memo:
            low = t.detach().to(dtype)
            memo[id(t)] = torch.nn.Parameter(low, requires_grad=t.requires_grad) \
                if isinstance(t, torch.nn.Parameter) else low
    return copy.deepcopy(model, memo)


def with_paths(model: torch.nn.Module, method: str, classes: Optional[Sequence[str]] = None,
               include_root: bool = False, share_parameters: bool = False) -> torch.nn.Module:
    """A copy of the reference whose modules (those of ``classes``, default all; the root itself
    with ``include_root``) run another of their own implementations: ``forward_triton``
    (interpreted on a CPU) or ``forward_native``; ``share_parameters`` as in :func:`copy_model`."""
    twin = copy_model(model, share_parameters)
    for m in twin.modules():
        if (m is not twin or include_root) and callable(getattr(m, method, None)) and (
                classes is None or type(m).__name__ in classes):
            m.forward = getattr(m, method)
    return twin


def with_rounding(model: torch.nn.Module, seed: int = 0, share_parameters: bool = False,
                  package: str = "kernels_reference") -> torch.nn.Module:
    """A copy of the reference in which every leaf kernel (a module of ``package``, a class a
    candidate tree could replace, with its own forward and no such module inside it; the root
    excluded) rounds its floating-point outputs as another honest implementation might: each
    value moved by a uniform random fraction of up to half its dtype's epsilon (relative) before
    it is rounded back to that dtype, so about three values in ten land one unit in the last place
    away. Leaves only: a layer's output is its kernels' output, rounded once, as in a real tree.

    Another tree differs from the reference in every kernel at once, each within rounding; the
    other noise runs (re-batching, the plain-PyTorch definition) move a few kernels' rounding,
    and on a random-weight MoE model an honest tree flipped 2-4x more stable tokens than any of
    them (Mixtral, H200 and H100, docs/perf/h200-e2e-decode.md). The draws come from one seeded
    generator per copy; they are not graph-safe, so the copy runs eagerly."""
    twin = copy_model(model, share_parameters)
    generators: Dict[torch.device, torch.Generator] = {}

    def rounded(value):
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel():
            gen = generators.get(value.device)
            if gen is None:
                gen = generators[value.device] = torch.Generator(device=value.device).manual_seed(seed)
            u = torch.rand(value.shape, generator=gen, device=value.device, dtype=torch.float32)
            eps = torch.finfo(value.dtype).eps
            wide = torch.float64 if value.dtype == torch.float64 else torch.float32
            wide_value = value.to(wide)
            return (wide_value + wide_value * ((u - 0.5) * eps)).to(value.dtype)
        if isinstance(value, tuple) and not hasattr(value, "_fields"):
            return tuple(rounded(v) for v in value)
        if isinstance(value, list):
            return [rounded(v) for v in value]
        return value

    def rounding(forward):
        def run(*args, **kwargs):
            return rounded(forward(*args, **kwargs))
        return run

    def kernel(m):
        return type(m).__module__.split(".")[0] == package and type(m).forward is not torch.nn.Module.forward

    for m in twin.modules():
        if m is not twin and kernel(m) and not any(kernel(c) for c in m.modules() if c is not m):
            m.forward = rounding(m.forward)
    return twin


def clone_input(value: Any) -> Any:
    """A fresh copy of the tensor *and the buffer around it*, viewed with the same strides.

    A strided input (Qwen3's per-head view into the fused qkv output) keeps its neighbours'
    real data, so a kernel that ignores strides reads what it would read in production.
    """
    if not isinstance(value, torch.Tensor):
        return value
    n = value.untyped_storage().nbytes() // value.element_size()
    whole = torch.empty(0, dtype=value.dtype, device=value.device).set_(value.untyped_storage(), 0, (n,), (1,))
    return whole.clone().as_strided(value.shape, value.stride(), value.storage_offset())


def clone_inputs(inputs: Mapping[str, Any]) -> Dict[str, Any]:
    return {k: clone_input(v) for k, v in inputs.items()}


def upcast_inputs(inputs: Mapping[str, Any]) -> Dict[str, Any]:
    return {k: v.to(torch.float64) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
            for k, v in inputs.items()}


@contextlib.contextmanager
def poisoned_allocations():
    """Make torch.empty & co. return NaN (floats) / max-int memory, so unwritten outputs show."""
    import torch.utils.deterministic as det

    was_on = torch.are_deterministic_algorithms_enabled()
    was_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    was_fill = det.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    det.fill_uninitialized_memory = True
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        det.fill_uninitialized_memory = was_fill
        torch.use_deterministic_algorithms(was_on, warn_only=was_warn)


SENTINEL = 1024.0  # exact in every float dtype


@contextlib.contextmanager
def sentinel_allocations():
    """Fill memory from torch.empty & co. with a finite sentinel (a second, different poison).

    Elements that are NaN under :func:`poisoned_allocations` and equal the sentinel here were
    never written by the candidate; the caching allocator cannot blur that, unlike a plain rerun.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    aten = torch.ops.aten
    factories = {aten.empty.memory_format, aten.empty_like.default, aten.empty_strided.default,
                 aten.new_empty.default, aten.new_empty_strided.default}

    class _Fill(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func in factories and isinstance(out, torch.Tensor) and out.is_floating_point():
                out.fill_(SENTINEL)
            return out

    with _Fill():
        yield


def synchronize(device: torch.device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def release_memory() -> None:
    """Free what a finished case, model copy or engine held.

    Modules often sit in reference cycles (a wrapper closure stored on the module it wraps, an
    engine and its CUDA graphs, a candidate's own back-references), and Python's cyclic collector
    knows nothing of GPU memory: full-size cases (float64 truth copies of an MoE layer are 2-11 GB)
    then pile up until an allocation fails. On the H200 this once kept ~130 GB alive."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
