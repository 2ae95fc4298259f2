"""pytest-xdist: parallel runs that end in one merged report.

Each xdist worker keeps its own session and journals every verdict it records
(:class:`fk_pytest.results.Results` with ``journal=True``). The journal rides on the worker's test
reports (``user_properties``, as xdist ships them to the controller) and is replayed into the
controller's session, which alone writes the JSON/HTML report and prints the table: a worker that
dies loses nothing it already reported. Task state that spans cases (a crashed candidate ends the
task's remaining cases, replayed-output detection) lives in one worker per task module, so the
default distribution is ``loadfile``. On CUDA, worker ``gw<i>`` runs its candidate evaluations on
GPU ``i`` (of the visible ones) and ``-n auto`` starts one worker per GPU.
"""
from __future__ import annotations

import base64
import os
import pickle
from typing import Optional

JOURNAL_KEY = "fastkernels-journal"


def worker_id(config) -> Optional[str]:
    """``gw0``, ``gw1``, ... on an xdist worker; None on the controller or without xdist."""
    workerinput = getattr(config, "workerinput", None)
    return workerinput.get("workerid") if workerinput else None


def worker_index(config) -> Optional[int]:
    wid = worker_id(config)
    return int(wid[2:]) if wid and wid.startswith("gw") and wid[2:].isdigit() else None


def is_controller(config) -> bool:
    """A session whose tests run in xdist workers (it merges, it does not evaluate)."""
    return worker_id(config) is None and bool(getattr(config.option, "numprocesses", None)) \
        and getattr(config.option, "dist", "no") != "no"


def gpu_env(config) -> Optional[dict]:
    """The evaluation worker's environment on xdist worker i: GPU i of the visible ones."""
    index = worker_index(config)
    if index is None:
        return None
    import torch
    count = torch.cuda.device_count()
    if count == 0:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",")] if visible else [str(i) for i in range(count)]
    return {"CUDA_VISIBLE_DEVICES": ids[index % len(ids)]}


def share_cpu_threads() -> None:
    """On the CPU under xdist, give each process its share of the cores: N workers each running
    torch with every core oversubscribe them, and small matrix products then slow down tenfold."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    if workers > 1:
        import torch
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


def encode(events: list) -> str:
    return base64.b64encode(pickle.dumps(events)).decode("ascii")


def decode(text: str) -> list:
    # Only this session's own xdist workers put this property on a report.
    return pickle.loads(base64.b64decode(text.encode("ascii")))


def attach_journal(report, results) -> None:
    """Worker side: move what the session recorded since the last report onto this report."""
    if results.journal:
        report.user_properties.append((JOURNAL_KEY, encode(results.journal)))
        results.journal.clear()


def take_journal(report) -> list:
    """Controller side: remove the journal from the report (junitxml and others never see it)."""
    events = []
    for item in list(report.user_properties):
        if isinstance(item, (tuple, list)) and len(item) == 2 and item[0] == JOURNAL_KEY:
            report.user_properties.remove(item)
            events += decode(item[1])
    return events
