"""The state models' HF agreement benchmark at tiny widths on the CPU: the GPU step's plumbing (HF
drawn at a trained scale, our model fed a packed prefill and decode steps through its pools and KV
cache) works before a device call is spent on it, and ours stays within 2x HF bf16's error."""
import json
import runpy
import sys

import pytest

from conftest import ROOT

pytest.importorskip("transformers", reason="the HF comparison needs transformers")


def test_tiny_cpu_run_gives_both_models_within_the_rule(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["hf_agreement_states", "--tiny-cpu"])
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.chdir(ROOT)
    runpy.run_path(str(ROOT / "benchmarks" / "hf_agreement_states.py"), run_name="__main__")
    rows = json.loads((tmp_path / "hf_agreement_states.json").read_text())
    assert [r["model"] for r in rows] == ["mamba2-2.7b", "qwen3-next-80b-a3b"]
    assert all(r["tiny"] and r["tokens"] == 502 and r["ratio"] <= 2 for r in rows), rows
    assert [r["layers"] for r in rows] == [2, 4]
    assert "| qwen3-next-80b-a3b | 4 | 502 |" in capsys.readouterr().out
