"""The shape of kernels_reference, checked from its import statements (parsed with ``ast``).

* ``kernels_reference/ops/<op>/`` holds kernels and never imports a module level ``L1``..``L4``;
* a level imports only the levels below it (L1 never imports L2.., L3 never imports L4);
* no import cycles among kernels_reference's modules (lazy imports inside functions included: a
  cycle hidden in a function is still two files that cannot be read one after the other);
* no file over ``MAX_LINES`` lines unless its opening docstring says why ("long because ...").
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Optional, Set

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "kernels_reference"
MAX_LINES = 450
LONG_REASON = "long because"


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path, root: Path = ROOT) -> Set[str]:
    """The kernels_reference modules ``path`` imports (at any depth of the file), as dotted names;
    ``from pkg import name`` counts as ``pkg.name`` when that is a module, else as ``pkg``."""
    name = _module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)
    return {m for m in found if m == PACKAGE or m.startswith(PACKAGE + ".")}


def import_graph(root: Path = ROOT) -> Dict[str, Set[str]]:
    files = {_module_name(p, root): p for p in sorted((root / PACKAGE).rglob("*.py"))}
    return {name: {m for m in _imports(path, root) if m in files and m != name} for name, path in files.items()}


def _level(module: str) -> Optional[int]:
    parts = module.split(".")
    if len(parts) > 1 and len(parts[1]) == 2 and parts[1][0] == "L" and parts[1][1].isdigit():
        return int(parts[1][1])
    return None


def find_cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Every group of modules that import each other in a circle (strongly connected components of
    more than one module, Tarjan's algorithm), each sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    cycles: List[List[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(cycles)


def layout_problems(root: Path = ROOT) -> List[str]:
    graph = import_graph(root)
    problems = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if module.startswith(f"{PACKAGE}.ops") and _level(target) is not None:
                problems.append(f"{module} (an op) imports the module level {target}")
            if _level(module) is not None and _level(target) is not None and _level(target) > _level(module):
                problems.append(f"{module} imports {target}, a higher level")
    for cycle in find_cycles(graph):
        problems.append("import cycle among: " + ", ".join(cycle))
    for path in sorted((root / PACKAGE).rglob("*.py")):
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES:
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            if LONG_REASON not in " ".join(doc.split()):
                problems.append(f"{path.relative_to(root)} has {lines} lines and its docstring does not say "
                                f"why ({LONG_REASON!r})")
    return problems


def test_kernels_reference_layout():
    assert layout_problems() == []


def test_the_check_sees_each_kind_of_problem(tmp_path):
    """The check itself can fail: a tree with one of each problem reports all four."""
    pkg = tmp_path / PACKAGE
    for folder in ("L1", "L2", "ops/decode"):
        (pkg / folder).mkdir(parents=True)
    for init in ("", "L1", "L2", "ops", "ops/decode"):
        (pkg / init / "__init__.py").write_text("")
    (pkg / "ops/decode/kernel.py").write_text("from ...L1 import attention\n")
    (pkg / "L1/attention.py").write_text("def f():\n    from ..L2 import block\n    from ..ops.decode import kernel\n")
    (pkg / "L2/block.py").write_text('"""A block."""\n' + "x = 1\n" * (MAX_LINES + 1))
    (pkg / "L2/short.py").write_text('"""This file is long because it must be."""\n' + "x = 1\n" * (MAX_LINES + 1))
    problems = layout_problems(tmp_path)
    assert any("ops.decode.kernel (an op) imports the module level kernels_reference.L1.attention" in p
               for p in problems)
    assert any("L1.attention imports kernels_reference.L2.block, a higher level" in p for p in problems)
    assert any(p.startswith("import cycle among: ") and "kernels_reference.ops.decode.kernel" in p for p in problems)
    assert any("L2/block.py has" in p for p in problems)
    assert not any("short.py" in p for p in problems)


def test_every_kernels_reference_package_is_in_the_wheel():
    """pyproject.toml lists packages by name: a new ops folder missing there is absent from the wheel."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    packages = {_module_name(init) for init in (ROOT / PACKAGE).rglob("__init__.py")}
    assert packages - listed == set()
