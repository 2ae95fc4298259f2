"""Load candidate modules: a tree laid out like ``kernels_reference`` or a single file.

A tree is imported as a private package (so candidate files may import their siblings with relative
imports); a single file is one module whose classes are matched to tasks by class name. Problems
become :class:`CandidateError` with a status; a task the candidate does not cover raises
:class:`NotAttempted`.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
import types
from pathlib import Path
from typing import Dict

from . import status
from .errors import CandidateError, NotAttempted
from .signatures import check_class
from .task import Task

# kernels_reference modules a candidate tree always shares with the framework (see _import_tree_module)
FRAMEWORK_MODULES = ("forward_context", "model_config", "parallel_state")


def tree_hash(path: Path, suffixes=(".py",)) -> str:
    """sha256 over the relative paths and bytes of the file, or of the tree's files with ``suffixes``."""
    files = [path] if path.is_file() else sorted(
        p for p in path.rglob("*") if p.is_file() and p.suffix in suffixes and "__pycache__" not in p.parts)
    digest = hashlib.sha256()
    for f in files:
        digest.update(str(f.relative_to(path.parent if path.is_file() else path)).encode())
        digest.update(f.read_bytes())
    return digest.hexdigest()


class CandidateSource:
    def __init__(self, path: str | Path):
        self.path = Path(path).resolve()
        if not self.path.exists():
            raise FileNotFoundError(f"--fk-candidate: {path} does not exist")
        self.is_file = self.path.is_file()
        if self.is_file and self.path.suffix != ".py":
            raise ValueError(f"--fk-candidate: {path} is neither a folder nor a .py file")
        self.hash = tree_hash(self.path)
        self._package = f"_fk_candidate_{self.hash[:12]}"
        self._modules: Dict[str, object] = {}  # module path -> module or CandidateError

    def describe(self) -> dict:
        return {"path": str(self.path), "kind": "file" if self.is_file else "tree", "sha256": self.hash}

    # ---- import ---------------------------------------------------------------------------------
    def _import(self, rel: str):
        if rel in self._modules:
            cached = self._modules[rel]
            if isinstance(cached, CandidateError):
                raise cached
            return cached
        try:
            module = self._import_file() if self.is_file else self._import_tree_module(rel)
        except CandidateError as exc:
            self._modules[rel] = exc
            raise
        except BaseException as exc:  # SyntaxError, ImportError, anything at import time
            err = CandidateError(status.IMPORT_ERROR, f"importing {rel} failed: {type(exc).__name__}: {exc}")
            self._modules[rel] = err
            raise err from exc
        self._modules[rel] = module
        return module

    def _import_file(self):
        name = f"{self._package}_file"
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, self.path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        return module

    def _import_tree_module(self, rel: str):
        if self._package not in sys.modules:
            package = types.ModuleType(self._package)
            package.__path__ = [str(self.path)]
            package.__file__ = str(self.path / "__init__.py")
            sys.modules[self._package] = package
            # The serving contract is the framework's, not the tree's: a tree that copies the
            # reference's files (relative imports included) must read the step's metadata from the
            # forward context the engine sets, take the configs the models are built with, and read
            # the tensor-parallel degree and rank the ranks set, not private copies of those modules
            # (whose context would always be empty, whose config classes would be other types, and
            # whose degree would always be 1: a copy of the reference then built unsharded layers
            # on every rank and failed every tensor-parallel case).
            for name in FRAMEWORK_MODULES:
                sys.modules[f"{self._package}.{name}"] = importlib.import_module(f"kernels_reference.{name}")
        dotted = ".".join(Path(rel).with_suffix("").parts)
        return importlib.import_module(f"{self._package}.{dotted}")

    # ---- resolution -----------------------------------------------------------------------------
    def has_module(self, task: Task) -> bool:
        return self.is_file or (self.path / task.module_path).is_file()

    def load_class(self, task: Task) -> type:
        return self.load(task.module_path, task.reference)

    def load(self, module_path: str, reference: type) -> type:
        """The candidate's class standing in for ``reference`` (defined in ``module_path``)."""
        name = reference.__name__
        if not (self.is_file or (self.path / module_path).is_file()):
            raise NotAttempted(f"no {module_path} in the candidate tree")
        module = self._import(module_path)
        cls = getattr(module, name, None)
        if cls is None:
            if self.is_file:
                raise NotAttempted(f"{self.path.name} defines no class {name}")
            raise CandidateError(status.MISSING_CLASS, f"{module_path} defines no class {name}")
        if not isinstance(cls, type):
            raise CandidateError(status.MISSING_CLASS, f"{name} in {module_path} is not a class")
        check_class(reference, cls)  # calls are checked as they happen (fk_pytest.signatures)
        return cls

    def module_paths(self) -> list:
        if self.is_file:
            return []
        return sorted(str(p.relative_to(self.path)) for p in self.path.rglob("L*/*.py"))
