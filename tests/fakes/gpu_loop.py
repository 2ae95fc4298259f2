"""fk_pytest.timing's GPU loop on the CPU: fake CUDA events and a runner that launches nothing.

``fake_events(monkeypatch, window_us)`` makes the n-th event pair the loop creates (1-based, in
the loop's order: its one-call estimates, then its rounds' one-call windows, then their K-call
windows) read ``window_us(n)`` microseconds, and turns the loop's synchronisations and busy-waits
into no-ops."""
import torch


class Event:
    def record(self):
        pass

    def elapsed_time(self, end):
        return end.ms


class Runner:
    """A runner of ``time_pair_cuda`` (graphed, one input set) whose calls do nothing."""

    mode, note, sets, calls = "cuda-graph", "", [{}], 1

    def launch(self, i):
        pass

    def launch_many(self):
        pass

    def amortise(self, extra, calls, rotate=True):
        self.calls = calls


def fake_events(monkeypatch, window_us):
    from fk_pytest import timing

    made = []

    def pair():
        made.append(1)
        start, end = Event(), Event()
        end.ms = window_us(len(made)) * 1e-3
        return start, end

    monkeypatch.setattr(timing, "_event_pair", pair)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: None)
