"""The HF agreement benchmarks of the state models and of the encoder and vision models, at tiny
widths on the CPU: each GPU step's plumbing (HF drawn at a trained scale and loaded into ours, ours
fed as production feeds it: engine steps through pools and KV cache, packed texts, image batches)
works before device time is spent on it, and ours stays within 2x HF bf16's error."""
import json
import runpy
import sys

import pytest

from conftest import ROOT

pytest.importorskip("transformers", reason="the HF comparison needs transformers")


def _run(script, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", [script, "--tiny-cpu"])
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.chdir(ROOT)
    runpy.run_path(str(ROOT / "benchmarks" / f"{script}.py"), run_name="__main__")
    return json.loads((tmp_path / f"{script}.json").read_text())


def test_state_models_at_tiny_widths_are_within_the_rule(tmp_path, monkeypatch, capsys):
    rows = _run("hf_agreement_states", tmp_path, monkeypatch)
    assert [r["model"] for r in rows] == ["mamba2-2.7b", "qwen3-next-80b-a3b"]
    assert all(r["tiny"] and r["tokens"] == 502 and r["ratio"] <= 2 for r in rows), rows
    assert [r["layers"] for r in rows] == [2, 4]
    assert "| qwen3-next-80b-a3b | 4 | 502 |" in capsys.readouterr().out


def test_encoder_and_vision_models_at_tiny_widths_are_within_the_rule(tmp_path, monkeypatch):
    rows = _run("hf_agreement_encoders", tmp_path, monkeypatch)
    assert [r["model"] for r in rows] == ["all-minilm-l6-v2", "bge-m3", "siglip2-so400m-vision", "dinov2-small",
                                          "dinov3-vitl16", "convnextv2-tiny"]
    assert all(r["tiny"] and r["values"] > 0 and 0 < r["hf_bf16_error"] and r["ratio"] <= 2 for r in rows), rows
