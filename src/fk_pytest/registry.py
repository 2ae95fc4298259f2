"""Find the suite's tasks by name (for use from other repositories' tests)."""
from __future__ import annotations

import importlib
import pkgutil
from typing import Dict

from .task import Task

_TASKS: Dict[str, Task] = {}


def _suite_package():
    for name in ("fk_tasks", "tasks"):  # installed wheel first, then a checkout
        try:
            pkg = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(pkg, "__path__") and getattr(pkg, "FASTKERNELS_SUITE", False):
            return pkg
    raise ImportError("the FastKernels task suite (fk_tasks) is not installed")


def all_tasks() -> Dict[str, Task]:
    if not _TASKS:
        pkg = _suite_package()
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            if info.name.rsplit(".", 1)[-1].startswith("test_"):
                task = getattr(importlib.import_module(info.name), "TASK", None)
                if isinstance(task, Task):
                    _TASKS[task.name] = task
    return _TASKS


def get_task(name: str) -> Task:
    tasks = all_tasks()
    if name not in tasks:
        raise KeyError(f"no task {name!r}; known: {', '.join(sorted(tasks))}")
    return tasks[name]


def workload_cases(name: str, profile: str = "cpu"):
    """The real-workload cases of a task, e.g. to parametrize a kernel repo's own tests."""
    return list(get_task(name).cases(profile))
