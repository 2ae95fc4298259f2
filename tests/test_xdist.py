"""pytest-xdist plumbing that needs no parallel run: GPU pinning, the journal's round trip."""
import types

import torch

from fk_pytest import plugin, xdist
from fk_pytest.correctness import CaseResult
from fk_pytest.results import Results, TaskInfo


def _config(workerid=None, device="cuda"):
    option = types.SimpleNamespace(fk_device=device, numprocesses=None, dist="no")
    config = types.SimpleNamespace(option=option)
    if workerid is not None:
        config.workerinput = {"workerid": workerid}
    return config


def test_worker_i_evaluates_on_gpu_i_of_the_visible_ones(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    assert xdist.gpu_env(_config("gw0")) == {"CUDA_VISIBLE_DEVICES": "4"}
    assert xdist.gpu_env(_config("gw3")) == {"CUDA_VISIBLE_DEVICES": "5"}  # wraps around
    assert xdist.gpu_env(_config(None)) is None  # the controller evaluates nothing
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert xdist.gpu_env(_config("gw1")) == {"CUDA_VISIBLE_DEVICES": "1"}


def test_n_auto_starts_one_worker_per_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert plugin.pytest_xdist_auto_num_workers(_config(device="auto")) == 8
    assert plugin.pytest_xdist_auto_num_workers(_config(device="cpu")) is None  # xdist's own default


def test_a_worker_journal_replays_into_the_same_results():
    info = TaskInfo("rms_norm", 1, "norm", "L1/rms_norm.py", "RMSNorm")
    worker, controller = Results(journal=True), Results()
    worker.record_case(info, CaseResult("c1", "workload", 7, "PASSED", swapped=["RMSNorm"]))
    worker.record_case(info, CaseResult("c2", "workload", 7, "WRONG_RESULT", "off by 3x"))
    worker.record_task_error(info, "degenerate case")
    report = types.SimpleNamespace(user_properties=[("other", 1)])
    xdist.attach_journal(report, worker)
    assert worker.journal == [] and report.user_properties[0] == ("other", 1)
    controller.replay(xdist.take_journal(report))
    assert report.user_properties == [("other", 1)]  # the journal never reaches junitxml & co.
    assert controller.tasks["rms_norm"].as_json() == worker.tasks["rms_norm"].as_json()
