"""``fk-stubs DIR [-k EXPR]``: a candidate tree of stubs and one prompt per task, for agents.

The tree is laid out like ``kernels_reference`` (``L1/rms_norm.py`` holding ``class RMSNorm``): one
file per module path with every selected task's class in it. Each class is call-compatible with the
reference: its ``__init__`` *is* the reference's constructor (copied from its source, with the
imports it uses, so parameter names and state_dict keys match and lower-level modules are the
reference's, swapped for candidates in composed mode), and ``forward`` keeps the reference's
signature, documents the interface contract, and only raises ``NotImplementedError``; the suite
reports such a class as NOT_IMPLEMENTED. ``prompts/<task>.md`` says what the module does, its
interface, the reference's source, the workload table, the tolerance rule, how C_t, S_t and
MacroEval are computed, the GPU it is timed on and the one command that scores it.
``manifest.json`` names the tree, its author, the date and the suite version.

Tasks are selected by pytest's own collection (``-k`` and ``-m`` mean what they mean there): the
plugin's ``--fk-stubs=DIR`` writes the stubs of the collected tasks and ends the session; the
``fk-stubs`` command runs that collection over the installed task suite. Everything here is read
from the Task objects and the reference's source: no task is named in this module.
"""
from __future__ import annotations

import argparse
import ast
import builtins
import copy
import datetime
import functools
import importlib
import importlib.metadata
import importlib.util
import inspect
import json
import os
import shlex
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from .task import Case, Task

SCHEMA = "fastkernels.stubs/1"
REFERENCE_PACKAGE = "kernels_reference"
PROMPTS = "prompts"

# The GPU the full profile is timed on, and roofline values recorded there (the run measures its own
# at start: copy bandwidth and bf16 GEMM rate, fk_pytest.timing.measure_roofline).
GPU = "NVIDIA H200"
RECORDED_ROOFLINES = (
    # (copy TB/s, bf16 GEMM TFLOP/s, where, when)
    (4.16, 787.0, "docs/perf/h200-peers.md", "2026-12-01, commit accbc58"),
    (4.11, 749.0, "docs/perf/h200-l1.md", "2026-11-29, commit 0055f38"),
)


class StubError(Exception):
    """The stubs cannot be written (a non-empty folder, an empty selection, a reference the
    generator cannot copy)."""


# ---- the reference's source ----------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _module_tree(modname: str) -> ast.Module:
    return ast.parse(inspect.getsource(sys.modules[modname]))


def _toplevel(body):
    """A module's top-level statements, looking into ``try``/``if`` blocks (optional imports)."""
    for node in body:
        yield node
        if isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _toplevel(block)
        elif isinstance(node, ast.If):
            yield from _toplevel(node.body)
            yield from _toplevel(node.orelse)


def _reference_classes(ref: type) -> List[type]:
    """``ref``'s MRO restricted to the reference's own module classes (not mixins, not nn.Module)."""
    return [c for c in ref.__mro__ if issubclass(c, torch.nn.Module)
            and c.__module__.startswith(REFERENCE_PACKAGE + ".")]


def _class_node(cls: type) -> ast.ClassDef:
    for node in _module_tree(cls.__module__).body:
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
            return node
    raise StubError(f"no class {cls.__name__} in the source of {cls.__module__}")


def _own_function(cls: type, name: str) -> Optional[ast.FunctionDef]:
    for node in _class_node(cls).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    return None


def _find_function(ref: type, name: str, after: Optional[type] = None):
    """(owner, FunctionDef) of the nearest reference class in ``ref``'s MRO defining ``name``
    (after ``after``, when given), or (None, None)."""
    classes = _reference_classes(ref)
    if after is not None:
        classes = classes[classes.index(after) + 1:]
    for cls in classes:
        node = _own_function(cls, name)
        if node is not None:
            return cls, node
    return None, None


def _import_binding(modname: str, name: str) -> Optional[str]:
    """An absolute import statement that binds ``name`` as module ``modname`` binds it; None for a
    builtin. Raises StubError when the module does not bind it at top level."""
    package = sys.modules[modname].__package__
    for node in _toplevel(_module_tree(modname).body):
        if isinstance(node, ast.Import):
            for a in node.names:
                if (a.asname or a.name.split(".")[0]) == name:
                    return f"import {a.name}" + (f" as {a.asname}" if a.asname else "")
        elif isinstance(node, ast.ImportFrom):
            base = importlib.util.resolve_name("." * node.level + (node.module or ""), package) \
                if node.level else node.module
            for a in node.names:
                if (a.asname or a.name) == name:
                    return f"from {base} import {a.name}" + (f" as {a.asname}" if a.asname else "")
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            return f"from {modname} import {name}"
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return f"from {modname} import {name}"
    if hasattr(builtins, name):
        return None
    raise StubError(f"{modname} uses {name!r} but does not bind it at top level")


def _free_names(node: ast.AST, bound: Sequence[str] = ()) -> List[str]:
    """Names a function (or signature) reads that it does not bind itself, in order of use."""
    bound = set(bound)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        a = node.args
        bound |= {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}
        bound |= {x.arg for x in (a.vararg, a.kwarg) if x is not None}
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, (ast.Store, ast.Del)):
            bound.add(sub.id)
        elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and sub is not node:
            bound.add(sub.name)
    loads = [s.id for s in ast.walk(node) if isinstance(s, ast.Name) and isinstance(s.ctx, ast.Load)]
    return [n for n in dict.fromkeys(loads) if n not in bound]


def _self_attributes(node: ast.AST) -> Tuple[List[str], set]:
    """(attributes read as ``self.X``, attributes assigned as ``self.X = ...``)."""
    reads, writes = [], set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self":
            (writes.add(sub.attr) if isinstance(sub.ctx, ast.Store) else reads.append(sub.attr))
    return list(dict.fromkeys(reads)), writes


class _Imports:
    """The import lines of one stub file, one binding per name (an alias where a name would
    shadow one of the file's own stub classes)."""

    def __init__(self, own_classes: Sequence[str]):
        self.own = set(own_classes)
        self.lines: Dict[str, str] = {}  # bound name -> import line

    def need(self, modname: str, name: str) -> str:
        """Bind ``name`` as ``modname`` does; returns the name to use in the stub's code."""
        line = _import_binding(modname, name)
        if line is None:
            return name
        bound = name
        if name in self.own:  # e.g. a reference class of the same name as a stub in this file
            if not line.startswith("from ") or " as " in line:
                raise StubError(f"cannot alias {line!r} in a stub file defining {name}")
            bound = f"_reference_{name}"
            line = f"{line} as {bound}"
        self._add(bound, line)
        return bound

    def need_object(self, obj: Any) -> str:
        name = obj.__qualname__
        if "." in name or name in self.own:
            raise StubError(f"cannot import {obj!r} by name into a stub")
        self._add(name, f"from {obj.__module__} import {name}")
        return name

    def _add(self, bound: str, line: str) -> None:
        if self.lines.get(bound, line) != line:
            raise StubError(f"two imports bind {bound!r}: {self.lines[bound]!r} and {line!r}")
        self.lines[bound] = line

    def block(self) -> str:
        """``import x`` lines first, then one ``from m import a, b`` line per module."""
        plain, names = set(), defaultdict(list)
        for line in self.lines.values():
            if line.startswith("from "):
                module, name = line[5:].split(" import ", 1)
                names[module].append(name)
            else:
                plain.add(line)
        froms = [f"from {m} import {', '.join(sorted(set(n)))}" for m, n in sorted(names.items())]
        return "\n".join(sorted(plain) + froms)


class _Rename(ast.NodeTransformer):
    def __init__(self, names: Dict[str, str]):
        self.names = names

    def visit_Name(self, node):
        if node.id in self.names:
            return ast.copy_location(ast.Name(self.names[node.id], node.ctx), node)
        return node


def _super_init_calls(fn: ast.FunctionDef) -> List[ast.Call]:
    return [c for c in ast.walk(fn) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
            and c.func.attr == "__init__" and isinstance(c.func.value, ast.Call)
            and isinstance(c.func.value.func, ast.Name) and c.func.value.func.id == "super"]


def _function_source(owner: type, fn: ast.FunctionDef, new_name: str, helper: Optional[str],
                     renames: Dict[str, str]) -> str:
    """The source of ``fn`` as a method of the stub: renamed to ``new_name``, its
    ``super().__init__(...)`` turned into ``self.<helper>(...)`` (the reference base's constructor,
    copied beside it), names renamed where imports were aliased. The original text (with its
    comments) is kept when the edits can be made on it; otherwise the function is unparsed."""
    lines = inspect.getsource(sys.modules[owner.__module__]).splitlines(keepends=True)
    first = min([fn.lineno] + [d.lineno for d in fn.decorator_list])
    text = textwrap.dedent("".join(lines[first - 1:fn.end_lineno]))  # whole lines: trailing comments too
    edited = text.replace(f"def {fn.name}(", f"def {new_name}(", 1)
    calls = _super_init_calls(fn)
    if helper and calls:
        if len(calls) == 1 and edited.count("super().__init__(") == 1:
            edited = edited.replace("super().__init__(", f"self.{helper}(")
        else:
            edited = None
    if edited is not None and not renames:
        return edited
    node = copy.deepcopy(fn)
    node.name = new_name
    for call in _super_init_calls(node) if helper else ():
        call.func = ast.Attribute(ast.Name("self", ast.Load()), helper, ast.Load())
    return ast.unparse(ast.fix_missing_locations(_Rename(renames).visit(node)))


# ---- one stub class ------------------------------------------------------------------------------
def _class_source(task: Task, contract: str, imports: _Imports, prompt: str, kv_cache: bool) -> str:
    """The stub class of ``task``: the reference's constructor (and what it needs from the class),
    forward with the reference's signature, the contract as its docstring, raising
    NotImplementedError."""
    ref = task.reference
    methods: List[str] = []
    class_attrs: Dict[str, str] = {}
    copied: Dict[str, Tuple[type, ast.FunctionDef]] = {}

    def add_function(owner, fn, new_name, helper=None):
        renames = {}
        for name in _free_names(fn):
            bound = imports.need(owner.__module__, name)
            if bound != name:
                renames[name] = bound
        methods.append(_function_source(owner, fn, new_name, helper, renames))
        copied[new_name] = (owner, fn)

    # The constructor, and each reference base's constructor it reaches through super().__init__.
    owner, init = _find_function(ref, "__init__")
    name = "__init__"
    while owner is not None:
        base, base_init = _find_function(ref, "__init__", after=owner)
        helper = f"_init_{base.__name__}" if base is not None and _super_init_calls(init) else None
        add_function(owner, init, name, helper)
        if helper is None:
            break
        owner, init, name = base, base_init, helper

    # What those functions read from the class: methods are copied, values become class attributes.
    pending = list(copied.values())
    while pending:
        _, fn = pending.pop()
        reads, writes = _self_attributes(fn)
        for attr in reads:
            if attr in writes or attr in copied or attr in class_attrs or hasattr(torch.nn.Module, attr):
                continue
            static = inspect.getattr_static(ref, attr, None)
            if static is None:
                continue  # an instance attribute set elsewhere in the constructor chain
            if isinstance(static, (staticmethod, classmethod, property)) or inspect.isfunction(static):
                m_owner, m_fn = _find_function(ref, attr)
                if m_owner is None:
                    raise StubError(f"{ref.__name__}.{attr} is used by the constructor but not found")
                add_function(m_owner, m_fn, attr)
                pending.append(copied[attr])
            else:
                class_attrs[attr] = _value_source(static, imports)

    # forward: the reference's signature, the contract, one raise.
    f_owner, fwd = _find_function(ref, "forward")
    if fwd is None:
        raise StubError(f"{ref.__name__} has no forward in its source")
    for name in _free_names(fwd.args) + (_free_names(fwd.returns) if fwd.returns is not None else []):
        if imports.need(f_owner.__module__, name) != name:
            raise StubError(f"forward's annotation {name!r} would shadow a stub class")
    signature = ast.unparse(fwd.args)
    returns = f" -> {ast.unparse(fwd.returns)}" if fwd.returns is not None else ""
    raise_line = (f'raise NotImplementedError("{ref.__name__}.forward is a stub (task {task.name}); '
                  f'see {prompt}")')
    head = f"def forward({signature}){returns}:"
    if len(head) > 96:  # the parameters on their own lines, as a formatter would put them
        params = "\n".join(textwrap.wrap(signature, 88, initial_indent="    ", subsequent_indent="    ",
                                         break_long_words=False, break_on_hyphens=False))
        head = f"def forward(\n{params}\n){returns}:"
    methods.append(f"{head}\n{_docstring(contract, 4)}\n    {raise_line}\n")

    others = sorted({n for c in _reference_classes(ref) for n in _defined_functions(c)
                    if n not in copied and n != "forward" and not n.startswith("__")})
    doc = [f"Stub of the reference ``{ref.__module__}.{ref.__name__}`` for the task ``{task.name}`` "
           f"(prompt: ``{prompt}``).", "",
           "The constructor is the reference's own: keep its parameter names and shapes (the suite "
           "loads the reference's state_dict with strict=True); add buffers or caches only as "
           "non-persistent state. Write ``forward``: the suite calls only the constructor and "
           "``forward``, checked by binding, and reports this class as NOT_IMPLEMENTED while "
           "forward only raises."]
    if kv_cache:
        doc += ["", "``self.kv_cache`` is bound by the suite (or the engine) before each call; keep the "
                "attribute."]
    if others:
        doc += ["", "The reference also has " + ", ".join(f"``{n}``" for n in others) + ": optional here "
                "(not called on a candidate; ``forward_native`` is the reference's semantic definition)."]
    body = [_docstring("\n".join(doc), 4)]
    body += [f"    {k} = {v}" for k, v in class_attrs.items()]
    body += [textwrap.indent(m.rstrip("\n"), "    ") for m in methods]
    return f"class {ref.__name__}(nn.Module):\n" + "\n\n".join(body) + "\n"


def _defined_functions(cls: type) -> List[str]:
    return [n.name for n in _class_node(cls).body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _value_source(value: Any, imports: _Imports) -> str:
    if isinstance(value, type) or inspect.isfunction(value):
        return imports.need_object(value)
    text = repr(value)
    try:
        if ast.literal_eval(text) == value:
            return text
    except (ValueError, SyntaxError):
        pass
    raise StubError(f"cannot write the class attribute value {value!r} into a stub")


def _wrap(text: str, width: int) -> List[str]:
    """Prose lines wrapped to ``width``; indented lines (calls, code) kept as they are."""
    out = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
        elif line[0] == " ":  # a call or code line: continued four columns further in
            indent = " " * (len(line) - len(line.lstrip()))
            out += textwrap.wrap(line.strip(), width, initial_indent=indent, subsequent_indent=indent + "    ",
                                 break_on_hyphens=False, break_long_words=False)
        else:
            lead = len(line) - len(line.lstrip("0123456789. -"))  # numbered / bulleted items
            out += textwrap.wrap(line, width, subsequent_indent=" " * lead, break_on_hyphens=False)
    return out


def _docstring(text: str, indent: int) -> str:
    text = text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    lines = _wrap(text.strip("\n"), 100 - indent)
    pad = " " * indent
    body = "\n".join((pad + line) if line.strip() else "" for line in lines[1:])
    return f'{pad}"""{lines[0]}' + (f"\n{body}\n{pad}" if len(lines) > 1 else "") + '"""'


# ---- the interface contract, from the task's own calls -------------------------------------------
def _dtype(t: torch.dtype) -> str:
    return str(t).replace("torch.", "")


def describe(value: Any) -> str:
    """A value as the contract shows it: ``bfloat16 [7, 4096]`` (strides when not contiguous)."""
    if isinstance(value, torch.Tensor):
        text = f"{_dtype(value.dtype)} {list(value.shape)}"
        if not value.is_contiguous():
            text += f" strides {tuple(value.stride())} (a view into a larger buffer)"
        return text
    if isinstance(value, (tuple, list)) and any(isinstance(v, torch.Tensor) for v in value):
        inner = ", ".join(describe(v) for v in value)
        return f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    if isinstance(value, (tuple, list)) and len(value) > 8:
        return f"[{', '.join(map(str, value[:4]))}, ... ({len(value)} values)]"
    if hasattr(value, "__dataclass_fields__"):
        fields = ", ".join(f"{f}={describe(getattr(value, f))}" for f in value.__dataclass_fields__)
        return f"{type(value).__name__}({fields})"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class Probe:
    """One real call of a task on a CPU-profile case: the arguments ``forward`` receives, the
    forward context and KV caches bound for it, the reference's outputs and the in-place rules."""

    def __init__(self, task: Task, case: Case, run_reference: bool = True):
        from .correctness import as_outputs

        self.task, self.case = task, case
        gen = torch.Generator().manual_seed(0)
        self.inputs = task.make_inputs(case, gen, torch.device("cpu"))
        self.output_names = tuple(task.output_names(case))
        self.mutable = tuple(task.mutable_inputs(case))
        self.inplace = tuple(task.inplace_outputs(case))
        self.args: tuple = ()
        self.kwargs: dict = {}
        self.context = None
        self.caches: List[Tuple[str, Any]] = []
        self.outputs: List[torch.Tensor] = []
        self.inputs_of: Dict[str, str] = {}  # filled by call_kinds
        if not run_reference:
            return
        module = task.reference(**task.init_args(case))
        task.init_weights(module, gen)
        module.to(dtype=case.dtype)  # as the suite builds it (fk_pytest.build.instantiate)
        handle = module.register_forward_pre_hook(self._record, with_kwargs=True)
        try:
            with torch.no_grad():
                result = task.call(module.eval(), dict(self.inputs))
        finally:
            handle.remove()
        self.module = module
        self.outputs = as_outputs(result, self.output_names, "the reference")

    def _record(self, module, args, kwargs):
        if self.args or self.kwargs:
            return None
        from kernels_reference.forward_context import get_forward_context

        self.args, self.kwargs = tuple(args), dict(kwargs)
        self.context = get_forward_context()
        self.caches = [(name, m.kv_cache) for name, m in module.named_modules()
                       if getattr(m, "kv_cache", None) is not None]
        return None

    def structure(self) -> tuple:
        """What distinguishes one kind of call from another (not the sizes, not the dtype)."""
        def kind(v):
            if isinstance(v, torch.Tensor):
                return ("tensor", v.dim(), v.is_contiguous())
            return type(v).__name__
        return (self.output_names, self.mutable, self.inplace,
                tuple((k, kind(v)) for k, v in self.inputs.items()))

    def call_text(self) -> str:
        parts = [describe(a) for a in self.args] + [f"{k}={describe(v)}" for k, v in self.kwargs.items()]
        return f"forward({', '.join(parts)})"

    def contract_lines(self) -> List[str]:
        lines = [self.call_text()]
        if self.context is not None:
            lines.append("reads the step's metadata from kernels_reference.forward_context."
                         f"get_forward_context(): {describe(self.context)}")
        for name, cache in self.caches:
            where = f"self.{name}.kv_cache" if name else "self.kv_cache"
            lines.append(f"{where} is bound before the call: {describe(cache)}")
        outs = ", ".join(f"{n}: {describe(o)}" for n, o in zip(self.output_names, self.outputs))
        lines.append(f"returns {outs}" if len(self.outputs) == 1 else
                     f"returns a tuple ({', '.join(self.output_names)}): {outs}")
        arguments = set(self.kwargs) | set(inspect.signature(self.module.forward).bind(*self.args, **self.kwargs)
                                           .arguments)
        bound = " (the task's cache inputs, bound as kv_cache above)" if self.caches and any(
            n not in arguments for n in self.inplace + self.mutable) else ""
        if self.inplace:
            lines.append(f"writes in place, compared like outputs: {', '.join(self.inplace)}{bound}")
        if self.mutable:
            lines.append(f"may write in place: {', '.join(self.mutable)}{bound}; every other input must "
                         "come back unchanged")
        else:
            lines.append("must leave every input unchanged (and return new tensors, not views of them)")
        return lines


def call_kinds(task: Task) -> List[Tuple[Probe, List[Case]]]:
    """The CPU profile's cases grouped by kind of call, each kind with a probe of its first case
    (which also carries ``inputs_of``: every case's inputs described, for the workload table)."""
    groups: Dict[tuple, List[Case]] = {}
    inputs_of: Dict[str, str] = {}
    for case in task.cases("cpu"):
        probe = Probe(task, case, run_reference=False)
        groups.setdefault(probe.structure(), []).append(case)
        inputs_of[case.id] = ", ".join(f"{k}={describe(v)}" for k, v in probe.inputs.items())
    kinds = [(Probe(task, cases[0]), cases) for cases in groups.values()]
    for probe, _ in kinds:
        probe.inputs_of = inputs_of
    return kinds


def contract_text(task: Task, kinds) -> str:
    ref = task.reference
    lines = [f"Task {task.name} (level {task.level}, family {task.family}): the interface contract.", "",
             "The suite builds the module with the reference's constructor arguments (by keyword) and "
             "calls it as below; each call must bind to this signature. The calls of the CPU profile, "
             "one per kind (shapes of its first case; the full profile has the same kinds at "
             "production sizes):", ""]
    for i, (probe, cases) in enumerate(kinds, 1):
        dtypes = ", ".join(dict.fromkeys(_dtype(c.dtype) for c in cases))
        lines.append(f"{i}. {len(cases)} case(s) like {cases[0].id} ({dtypes}):")
        lines += [f"       {line}" for line in probe.contract_lines()]
    lines += ["", "Every output: the reference's shape and dtype, every element written (outputs are "
              "checked against poisoned memory), finite where the float64 truth is finite, within "
              f"{task.limit}x the reference's own error (see the prompt for the rule)."]
    fdoc = inspect.getdoc(getattr(ref, "forward"))
    if fdoc and fdoc != inspect.getdoc(torch.nn.Module.forward):
        lines += ["", "The reference's forward says:", "", *fdoc.splitlines()]
    return "\n".join(lines)


# ---- the prompt ------------------------------------------------------------------------------------
def _reference_file(ref: type) -> str:
    return ref.__module__.replace(".", "/") + ".py"


def _calls_into(ref: type) -> List[str]:
    """What the reference's module uses of the reference package, and the Triton kernels it defines."""
    modname = ref.__module__
    package = sys.modules[modname].__package__
    used, kernels = defaultdict(list), []
    for node in _toplevel(_module_tree(modname).body):
        if isinstance(node, ast.ImportFrom):
            base = importlib.util.resolve_name("." * node.level + (node.module or ""), package) \
                if node.level else node.module
            if base and base.startswith(REFERENCE_PACKAGE + "."):
                used[base] += [a.name for a in node.names]
        elif isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list):
            kernels.append(node.name)
    lines = [f"`{m.replace('.', '/')}.py`: {', '.join(f'`{n}`' for n in names)}" for m, names in used.items()]
    if kernels:
        lines.append(f"Triton kernels defined in `{_reference_file(ref)}`: " + ", ".join(f"`{k}`" for k in kernels))
    return lines


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)) and len(value) > 6:
        numeric = all(isinstance(v, (int, float)) for v in value)
        tail = f", sum {sum(value)}" if numeric else ""
        return f"[{', '.join(map(str, value[:3]))}, ... ({len(value)} values{tail})]"
    return str(value)


def _params(case: Case) -> str:
    return ", ".join(f"{k}={_short(v)}" for k, v in case.params.items())


def _full_rows(task: Task, cases: Sequence[Case]) -> List[str]:
    copy_tbps, gemm_tflops = RECORDED_ROOFLINES[0][:2]
    total = sum(c.weight for c in cases) or 1.0
    rows = ["| case | dtype | model | weight | share of S_t | bytes moved | FLOPs | roofline floor (us) | params |",
            "|---|---|---|---|---|---|---|---|---|"]
    for c in cases:
        nbytes, flops = task.io_bytes(c), task.flops(c)
        floor = max(nbytes / (copy_tbps * 1e12), flops / (gemm_tflops * 1e12)) * 1e6
        rows.append(f"| `{c.id}` | {_dtype(c.dtype)} | {c.model or '-'} | {c.weight:.4g} | {100 * c.weight / total:.2f}% "
                    f"| {nbytes:.3g} | {flops:.3g} | {floor:.3g} | {_params(c)} |")
    return rows


def _cpu_rows(cases: Sequence[Case], inputs_of: Dict[str, str]) -> List[str]:
    rows = ["| case | dtype | model | weight | inputs |", "|---|---|---|---|---|"]
    for c in cases:
        rows.append(f"| `{c.id}` | {_dtype(c.dtype)} | {c.model or '-'} | {c.weight:.4g} | {inputs_of[c.id]} |")
    return rows


def _score_command(task: Task, tree: str) -> Tuple[str, str]:
    """(CPU command, GPU command) that score this one task."""
    module = next((m for m in list(sys.modules.values())
                   if getattr(m, "TASK", None) is task and m.__name__.rsplit(".", 1)[-1].startswith("test_")), None)
    if module is None:
        raise StubError(f"task {task.name}: its test module is not imported")
    path = Path(module.__file__)
    if path.parents[1].name == "tasks":  # a checkout (also behind an editable install): its files
        target = f"tasks/{path.parent.name}/{path.name}"
    else:  # installed from a wheel
        target = f"--pyargs {module.__name__}"
    cpu = f"pytest {target} --fk-candidate={tree}"
    return cpu, f"{cpu} --fk-device=cuda"


def prompt_text(task: Task, kinds, tree: str, stub_file: str) -> str:
    ref = task.reference
    task_doc = inspect.getdoc(sys.modules[type(task).__module__]) or ""
    ref_doc = inspect.getdoc(sys.modules[ref.__module__]) or ""
    probe = kinds[0][0]
    full, cpu_cases = list(task.cases("full")), list(task.cases("cpu"))
    cpu_cmd, gpu_cmd = _score_command(task, tree)
    fuzz = ", ".join(getattr(task, "fuzz_dtypes", ("bf16", "fp16", "fp32")))
    source = inspect.getsource(sys.modules[ref.__module__])
    entries = [f"`{k}` {list(v.shape)}" for k, v in probe.module.state_dict().items()]
    state = ", ".join(entries[:12]) + (f", ... ({len(entries)} tensors in all)" if len(entries) > 12 else "") \
        if entries else "no tensors"
    init_sig = inspect.signature(ref.__init__)
    fwd_sig = inspect.signature(ref.forward)
    out = [
        f"# Task `{task.name}`: `{ref.__name__}` (level {task.level}, family `{task.family}`)", "",
        f"Write `forward` of `class {ref.__name__}` in `{stub_file}` of this tree (the stub is there, with "
        "the reference's constructor). Any implementation is fine: Triton, CUDA "
        "(`torch.utils.cpp_extension.load_inline`) or PyTorch; it may import `kernels_reference`, but a "
        "class that runs the reference's code is reported as DELEGATED (correct, not a new kernel, no speedup).",
        "", "## What the module does", "", task_doc, "", "The reference module's description:", "", ref_doc,
        "", "## Interface", "",
        f"`{ref.__name__}{init_sig}`".replace("(self, ", "(").replace("(self)", "()"),
        f"and `forward{fwd_sig}`".replace("(self, ", "("), "",
        f"The suite builds it as `{ref.__name__}(**init_args)`, e.g. `{describe(task.init_args(probe.case))}` "
        f"(case `{probe.case.id}`), loads the reference's state_dict with strict=True (there: {state}) and "
        "casts it to the case dtype.", "",
        "```text", contract_text(task, kinds), "```", "",
        "Rules that hold for every task: no NaN/Inf where the truth is finite; every output element written; "
        "inputs that may not be written come back unchanged (`INPUT_MUTATED`) and no output aliases them "
        "(`OUTPUT_ALIASES_INPUT`); outputs are fresh tensors each call (`REPLAYED_OUTPUT`); no work left "
        "running on other streams or threads after the call returns (`WORK_ESCAPED`).",
    ]
    if task.level > 1:
        out += ["", f"Lower-level modules inside it are the reference's (imported from `{REFERENCE_PACKAGE}`). "
                "In the default `--fk-mode=independent` your class runs with those reference children; with "
                "`--fk-mode=composed` the tree's own lower-level classes are swapped in (a stub left "
                "unwritten stays the reference)."]
    out += ["", "## The reference", "",
            f"`{_reference_file(ref)}`, class `{ref.__name__}` (`forward` dispatches: CUDA tensors to the fast "
            "path, the CPU and torch.compile to `forward_native`, the semantic definition and the float64 truth)."]
    calls = _calls_into(ref)
    if calls:
        out += ["", "It uses:", ""] + [f"- {line}" for line in calls]
    out += ["", "<details><summary>full source of " + _reference_file(ref) + "</summary>", "", "```python",
            source.rstrip(), "```", "", "</details>", "",
            "## Workloads", "",
            f"Full profile (the GPU run, `--fk-device=cuda`): {len(full)} cases. `weight` is the case's share "
            "of the calls of this module in the captured serving scenarios (`tasks/workloads/`; hand-picked "
            "shapes weigh little); S_t's geomean uses these weights. Bytes and FLOPs are the fewest the op "
            "must move and compute; the roofline floor is their time at the recorded H200 rates below.", ""]
    out += _full_rows(task, full)
    out += ["", f"CPU profile (`--fk-device=cpu`, the default without a GPU): {len(cpu_cases)} cases, small "
            "real shapes; Triton runs in its interpreter there.", ""]
    out += _cpu_rows(cpu_cases, probe.inputs_of)
    out += ["", f"Each workload case runs {task.seeds} input draw(s) with real-model value distributions. "
            f"Fuzzing: `test_fuzz[dtype]` for {fuzz} draws shapes around the real ones with hypothesis "
            "(other real widths, odd token counts such as 1, 3, 127, 129, strided layouts); 4 examples per "
            "dtype on the CPU profile, 25 on the full one; `--fk-seed` changes them, so do not special-case "
            "the shapes above.", "",
            "## Correctness rule", "",
            "For every output: `e = ||out - truth|| / ||truth||` against the reference's `forward_native` run "
            "in float64; the case passes when `e_cand / max(e_ref, floor) <= "
            f"{task.limit}` (this task's limit), where `e_ref` is the reference's own error at the case dtype "
            "and `floor` the error of storing the truth in that dtype (at least 1e-6 for float32), and the "
            "per-element view (max error over the truth's RMS) is within twice that. Integer outputs must "
            "match exactly. On the CPU a candidate that launches interpreted Triton kernels gets the bf16 bar "
            "of truncating conversions (the interpreter truncates); the GPU bar is the strict one.", "",
            "## Scores: C_t, S_t, MacroEval", "",
            "- `C_t`: the share of this task's cases passed (workload cases x draws, plus fuzz examples); the "
            "task is *valid* when every case passes. Its status is its first failing case's.",
            "- `S_t` (valid tasks only, GPU only): the geometric mean over the workload cases of "
            "reference time / candidate time, weighted by `weight` above. Times are GPU times of CUDA-graph "
            "replays (eager CUDA events where a module cannot be captured), L2 flushed, inputs rotated, "
            "candidate and reference interleaved; decode-sized calls are timed K to a replay.",
            f"- MacroEval = S x C x Cov over families: per family (`{task.family}` here) `S_f` = geomean of "
            "S_t over its valid tasks, `C_f` = mean C_t, `Cov_f` = share valid; S = geomean of S_f, C and Cov "
            "= means over families. A CPU run has no S: MacroEval = C x Cov there.", "",
            f"## The GPU and the roofline", "",
            f"The full profile is timed on an {GPU}. The run measures its roofline at the start (copy "
            "bandwidth of a 1 GiB copy and the bf16 rate of an 8192^3 GEMM); recorded values:", ""]
    out += [f"- copy {bw} TB/s, bf16 GEMM {tf:g} TFLOP/s ({where}, {when})" for bw, tf, where, when in RECORDED_ROOFLINES]
    out += ["", "A time under 85% of a case's roofline floor is `SUSPECT_SPEED` (not a record: a suspect).", "",
            "## Score it", "", "```bash", cpu_cmd, gpu_cmd + "   # on a GPU: the full profile, timed", "```", "",
            f"The verdict is the task's status in the table at the end (and in `--fk-report=r.json`): "
            "NOT_IMPLEMENTED while `forward` only raises."]
    return "\n".join(out) + "\n"


# ---- the tree ------------------------------------------------------------------------------------
def stub_file_text(tasks: Sequence[Task], kinds_of: Dict[str, list], prompt_of: Dict[str, str]) -> str:
    """One stub file: every selected class of one module path, in the reference's order."""
    tasks = sorted(tasks, key=lambda t: (t.reference.__module__, _class_node(t.reference).lineno))
    imports = _Imports([t.class_name for t in tasks])
    imports.lines["nn"] = "from torch import nn"
    classes = []
    for task in tasks:
        probe = kinds_of[task.name][0][0]
        has_cache = any(n == "" for n, _ in probe.caches) or hasattr(probe.module, "kv_cache")
        classes.append(_class_source(task, contract_text(task, kinds_of[task.name]), imports,
                                     prompt_of[task.name], has_cache))
    refs = sorted({t.reference.__module__ for t in tasks})
    descriptions = "\n\n".join(f"{m.replace('.', '/')}.py:\n\n{inspect.getdoc(sys.modules[m]) or ''}"
                               for m in refs)
    header = (f"Stubs written by fk-stubs for the FastKernels task(s) "
              f"{', '.join(t.name for t in tasks)}: one prompt each in {PROMPTS}/.\n\n"
              "Each class keeps the reference's constructor (the same parameter names and state_dict keys) "
              "and forward signature; forward raises NotImplementedError until it is written (the suite "
              "reports NOT_IMPLEMENTED). Lower-level modules come from kernels_reference, as in production "
              "code.\n\nThe reference, " + descriptions)
    return (_docstring(header, 0) + "\n" + imports.block() + "\n\n\n" + "\n\n".join(classes))


def _suite_version() -> Dict[str, Optional[str]]:
    try:
        version = importlib.metadata.version("fastkernels")
    except importlib.metadata.PackageNotFoundError:
        version = None
    here = Path(__file__).resolve().parent
    commit = dirty = None
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                                timeout=10).stdout.strip() or None
        if commit:
            dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                                        capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return {"version": version, "commit": commit, "dirty": dirty}


def write_tree(tasks: Sequence[Task], out: str | Path, author: Optional[str] = None, command: str = "",
               force: bool = False, kinds_of: Optional[Dict[str, list]] = None) -> List[Path]:
    """Write the stub files, one prompt per task and the manifest; returns the files written.
    ``kinds_of``: the tasks' :func:`call_kinds`, when the caller has them already."""
    out = Path(out)
    if not tasks:
        raise StubError("no task selected")
    if out.exists() and not out.is_dir():
        raise StubError(f"{out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise StubError(f"{out} exists and is not empty (choose a new folder, or --force to overwrite "
                        "the files fk-stubs writes there)")
    tasks = sorted(tasks, key=lambda t: (t.level, t.module_path, t.name))
    kinds_of = {t.name: (kinds_of or {}).get(t.name) or call_kinds(t) for t in tasks}
    prompt_of = {t.name: f"{PROMPTS}/{t.name}.md" for t in tasks}
    by_file: Dict[str, List[Task]] = defaultdict(list)
    for t in tasks:
        by_file[t.module_path].append(t)
    texts = {rel: stub_file_text(members, kinds_of, prompt_of) for rel, members in by_file.items()}
    for t in tasks:
        texts[prompt_of[t.name]] = prompt_text(t, kinds_of[t.name], str(out), t.module_path)
    manifest = {
        "schema": SCHEMA, "name": out.resolve().name,
        "author": author or os.environ.get("FK_AUTHOR") or "unknown",
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "suite": _suite_version(), "command": command,
        "tasks": [{"name": t.name, "level": t.level, "family": t.family, "file": t.module_path,
                   "class": t.class_name, "prompt": prompt_of[t.name]} for t in tasks],
    }
    texts["manifest.json"] = json.dumps(manifest, indent=2) + "\n"
    written = []
    for rel, text in texts.items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written


# ---- pytest and the command line -----------------------------------------------------------------
class _Invocation:
    """Carries the ``fk-stubs`` command line into the pytest run it starts (for the manifest)."""

    def __init__(self, command: str):
        self.command = command


def selected_tasks(items) -> List[Task]:
    tasks = {}
    for item in items:
        task = getattr(getattr(item, "function", None), "_fk_task", None)
        if isinstance(task, Task):
            tasks.setdefault(task.name, task)
    return list(tasks.values())


def write_from_session(session) -> None:
    """``--fk-stubs=DIR``: write the stubs of the collected tasks, then run nothing."""
    import pytest

    config = session.config
    tasks = selected_tasks(session.items)
    if not tasks:
        expr = config.getoption("keyword") or ""
        marks = config.getoption("markexpr") or ""
        what = " and ".join(x for x in (f"-k {expr!r}" if expr else "", f"-m {marks!r}" if marks else "") if x)
        raise pytest.UsageError(f"--fk-stubs: {what or 'the collection'} selects no task")
    invocation = next((p for p in config.pluginmanager.get_plugins() if isinstance(p, _Invocation)), None)
    command = invocation.command if invocation else shlex.join(["pytest", *config.invocation_params.args])
    try:
        written = write_tree(tasks, config.getoption("fk_stubs"), author=config.getoption("fk_stubs_author"),
                             command=command, force=config.getoption("fk_stubs_force"))
    except StubError as exc:
        raise pytest.UsageError(f"--fk-stubs: {exc}") from None
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        for path in written:
            reporter.write_line(f"fk-stubs: wrote {path}")
        reporter.write_line(f"fk-stubs: {len(tasks)} task(s); no test runs with --fk-stubs")
    config.hook.pytest_deselected(items=list(session.items))
    session.items[:] = []
    config.pluginmanager.register(_WrittenIsSuccess(), "fk-stubs-exit-status")


class _WrittenIsSuccess:
    """With every test deselected pytest would exit 5 (no tests collected); the stubs were the job."""

    @staticmethod
    def pytest_sessionfinish(session):
        import pytest

        if session.exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
            session.exitstatus = pytest.ExitCode.OK


def _suite_target() -> List[str]:
    from .registry import _suite_package

    pkg = _suite_package()
    return [str(Path(next(iter(pkg.__path__))))]


def main(argv: Optional[Sequence[str]] = None) -> int:
    import pytest

    parser = argparse.ArgumentParser(
        prog="fk-stubs", description="Write a candidate tree of stubs (laid out like kernels_reference) "
        "with one prompt per task and a manifest, for the tasks that pytest's -k/-m select.")
    parser.add_argument("dir", help="the folder to write (must be new or empty unless --force)")
    parser.add_argument("-k", dest="keyword", default=None, metavar="EXPR",
                        help="select tasks as pytest -k does (default: every task)")
    parser.add_argument("-m", dest="markexpr", default=None, metavar="MARKEXPR",
                        help="select tasks by marker, as pytest -m (level1..level4, families)")
    parser.add_argument("--author", default=None,
                        help="the tree's author or agent, for the manifest (default: $FK_AUTHOR or 'unknown')")
    parser.add_argument("--force", action="store_true", help="write into a non-empty folder")
    args = parser.parse_args(argv)
    command = shlex.join(["fk-stubs", *(sys.argv[1:] if argv is None else argv)])
    # (this module's imports loaded hypothesis before pytest starts: its rewrite warning is noise here)
    pytest_args = [*_suite_target(), "-q", "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning",
                   "--fk-device=cpu", f"--fk-stubs={args.dir}"]
    if args.keyword:
        pytest_args += ["-k", args.keyword]
    if args.markexpr:
        pytest_args += ["-m", args.markexpr]
    if args.author:
        pytest_args += [f"--fk-stubs-author={args.author}"]
    if args.force:
        pytest_args += ["--fk-stubs-force"]
    return int(pytest.main(pytest_args, plugins=[_Invocation(command)]))


if __name__ == "__main__":  # python -m fk_pytest.stubs: the plugin must see this module's _Invocation
    from fk_pytest.stubs import main as _main

    sys.exit(_main())
