"""The chunk table the chunked scans share (kernels_reference/ops/chunk_table.py): its (start, end)
rows for the delta-rule family agree with the per-column table Mamba-2's scan reads, and every
chunked scan runs without reading device values on the host (no sync stalls a prefill, and a
CUDA-graph capture can hold it)."""
import importlib

import pytest
import torch

from fk_pytest.host_sync import HostSyncCheck
from fk_pytest.registry import _suite_package

pytest.importorskip("triton")


@pytest.mark.parametrize("lengths, chunk", [((5, 0, 300, 1), 128), ((0,), 64), ((64, 63, 65, 1, 0, 130), 64)])
def test_chunk_pairs_are_the_tables_rows(monkeypatch, lengths, chunk):
    from kernels_reference.ops.chunk_table import chunk_pairs, chunk_table

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    cu = torch.tensor([0] + torch.cumsum(torch.tensor(lengths), 0).tolist(), dtype=torch.int32)
    bound, _, start, length, first, _ = chunk_table(cu, int(cu[-1]), chunk)
    pairs = chunk_pairs(cu, int(cu[-1]), chunk)
    assert pairs.table.shape == (bound, 2) and pairs.table.dtype == torch.int32
    assert pairs.table[:, 0].tolist() == start.tolist()
    assert pairs.table[:, 1].tolist() == (start + length).tolist()
    assert pairs.first_chunk.tolist() == first.tolist()
    real = sum(-(-n // chunk) for n in lengths)
    assert all(s == e for s, e in pairs.table[real:].tolist())  # the bound's tail: empty chunks


def _suite_inputs(module: str, fn: str):
    return getattr(importlib.import_module(f"{_suite_package().__name__}.{module}"), fn)


# Each scan's task inputs (carried states, float32) for the given sequence lengths, at small heads.
def _gated_delta(lengths, gen):
    return _suite_inputs("gated_delta_inputs", "gated_delta_inputs")(lengths, 1, 2, 32, 32, True, gen, "cpu",
                                                                     torch.float32)


def _gla(lengths, gen):
    return _suite_inputs("gla_inputs", "gla_inputs")(lengths, 2, 32, 48, True, gen, "cpu", torch.float32)


def _rwkv7(lengths, gen):
    return _suite_inputs("rwkv7_inputs", "rwkv7_inputs")(lengths, 1, 32, 48, True, gen, "cpu", torch.float32,
                                                         decay_rank=8, a_rank=8)


@pytest.mark.parametrize("name, inputs", [("gated_delta_rule.GatedDeltaRule", _gated_delta),
                                          ("gla.ChunkGLA", _gla), ("rwkv7.ChunkRWKV7", _rwkv7)],
                         ids=["gated-delta", "gla", "rwkv7"])
def test_chunked_prefill_reads_nothing_on_the_host(monkeypatch, name, inputs):
    """The chunked path under the host-sync check (it built its chunk table on the host before,
    with ``int()`` of a device count), on a batch with an empty sequence, still the recurrence."""
    module_name, cls_name = name.split(".")
    cls = getattr(importlib.import_module(f"kernels_reference.L1.{module_name}"), cls_name)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    args = inputs((70, 0, 3), torch.Generator().manual_seed(1))
    with HostSyncCheck(cls_name):
        o, state = cls().forward_triton(**args)
    wide = {n: (x.double() if torch.is_tensor(x) and x.is_floating_point() else x) for n, x in args.items()}
    truth_o, truth_state = cls().forward_native(**wide)
    assert float((o.double() - truth_o).norm() / truth_o.norm()) < 1e-5
    assert float((state.double() - truth_state).norm() / truth_state.norm()) < 1e-5
