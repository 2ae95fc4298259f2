"""FastKernels: a pytest plugin that scores GPU kernels the way production runs them.

Public API for task authors and for other repositories' tests:

* :class:`Task`, :class:`Case`, :func:`standard_tests` — declare a task;
* :func:`get_task`, :func:`workload_cases` — the suite's tasks and their real-workload cases;
* :func:`evaluate_case` — the calibrated verdict of one kernel class on one case;
* fixtures ``fk_check`` and ``fk_session`` (available once the package is installed).
"""
from .correctness import CaseResult, evaluate_case
from .registry import get_task, workload_cases
from .standard_tests import standard_tests
from .task import DTYPES, Case, Task

__all__ = ["Case", "CaseResult", "DTYPES", "Task", "evaluate_case", "get_task", "standard_tests",
           "workload_cases"]
