"""Per-step plans (``plan_step``, kernels_reference/forward_context.py): a module that plans each step
on the host before its forward, as FlashInfer's wrappers do, gets that plan from the engine (eager
steps, padded decode steps) and from the kernel-level tasks. The FlashInfer candidate tree
(examples/candidates/flashinfer) runs through both here with a torch stand-in for FlashInfer
(tests/fakes/flashinfer.py), whose CUDA-graph-mode wrappers read the plan from fixed buffers as
FlashInfer's do: a step whose plan is missing or stale gets a wrong answer or an error."""
import dataclasses
import sys

import pytest
import torch
from torch import nn

from conftest import CANDIDATES, ROOT
from fakes import flashinfer as fake_flashinfer
from fk_pytest import get_task, status
from fk_pytest.candidates import CandidateSource
from kernels_reference.engine import LLM, SamplingParams
from kernels_reference.forward_context import get_forward_context, plan_step
from test_engine import PROMPTS, _tiny
from test_verdicts import verdicts

FLASHINFER_TREE = ROOT / "examples" / "candidates" / "flashinfer"


@pytest.fixture
def flashinfer_attention(monkeypatch):
    """The FlashInfer tree's ``Attention`` class, importing the stand-in as ``flashinfer``."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # its cache store is the reference's Triton kernel
    monkeypatch.setitem(sys.modules, "flashinfer", fake_flashinfer)

    def load(tree=FLASHINFER_TREE):
        return CandidateSource(tree).load_class(get_task("attention"))
    return load


class _PlanRecorder(nn.Module):
    """Records each plan's metadata, and the forward context each attention call saw."""

    def __init__(self):
        super().__init__()
        self.planned, self.seen = [], []

    def plan_step(self, meta):
        self.planned.append(meta)


def _swap_attention(model, cls):
    for layer in model.model.layers:
        old = layer.self_attn.attn
        layer.self_attn.attn = cls(old.num_heads, old.head_size, old.scale, old.num_kv_heads)


@pytest.mark.parametrize("padded", [False, True], ids=["eager", "padded-decode"])
def test_the_engine_plans_each_step_once_before_its_forward(flashinfer_attention, padded):
    _, model = _tiny()
    params = SamplingParams(max_tokens=8)
    engine = dict(num_blocks=64, block_size=4, max_num_batched_tokens=8, padded_decode=padded, max_num_seqs=8)
    want = LLM(model, **engine).generate(PROMPTS, params)
    _swap_attention(model, flashinfer_attention())
    recorder = _PlanRecorder()
    model.add_module("plan_recorder", recorder)
    first = model.model.layers[0].self_attn.attn
    forward = first.forward
    first.forward = lambda *a: (recorder.seen.append(get_forward_context()), forward(*a))[1]
    llm = LLM(model, **engine)
    assert llm.generate(PROMPTS, params) == want
    # One plan per step, with the very metadata the layers then read.
    assert recorder.seen and [id(m) for m in recorder.planned] == [id(m) for m in recorder.seen]
    decode_steps = llm.runner.steps["decode-padded" if padded else "decode-eager"]
    assert decode_steps >= params.max_tokens - 2, llm.runner.steps


def test_a_failing_plan_names_its_module(flashinfer_attention):
    class Broken(nn.Module):
        def plan_step(self, meta):
            raise KeyError("no such page")

    from kernels_reference.forward_context import AttentionMetadata
    meta = AttentionMetadata.build([3], [2], block_size=4)
    with pytest.raises(RuntimeError, match=r"Broken.plan_step failed on the step's metadata \(1 sequences, 2 tokens\): "
                                           r"KeyError"):
        plan_step([Broken().plan_step], meta)


def test_flashinfer_tree_passes_the_attention_task_and_a_stale_plan_fails_it(flashinfer_attention):
    task = get_task("attention")
    cases = task.cases("cpu")
    counts, results = verdicts("attention", flashinfer_attention(), cases)
    assert counts == {status.PASSED: len(results)}, [r.message for r in results if not r.passed][:3]
    # A decode batch, then one of as many sequences with longer contexts: the second runs on the
    # first one's plan when the plan is kept per batch size.
    decode = next(c for c in cases if "-decode-" in c.id)
    longer = dataclasses.replace(decode, id=decode.id + "-longer",
                                 params=dict(decode.params, context=[c + 9 for c in decode["context"]]))
    stale = flashinfer_attention(CANDIDATES / "flashinfer_plan_per_batch_size")
    counts, results = verdicts("attention", stale, [decode, longer])
    assert [r.status for r in results] == [status.PASSED, status.WRONG_RESULT], [r.message for r in results]


def test_the_flashinfer_tree_runs_float32_steps_without_flashinfer(flashinfer_attention):
    """FlashInfer plans half types only (the stand-in refuses float32 as it does); the tree's float32
    steps, which the task's fuzzing draws, gather each sequence and attend with torch: decode,
    prefill and mixed steps pass the task's check, GQA included."""
    task = get_task("attention")
    fp32 = [dataclasses.replace(c, id=c.id.replace("-bf16", "-fp32"), dtype=torch.float32)
            for c in task.cases("cpu")]
    counts, results = verdicts("attention", flashinfer_attention(), fp32)
    assert counts == {status.PASSED: len(results)}, [r.message for r in results if not r.passed][:3]
    assert any("-decode-" in c.id for c in fp32) and any("-prefill-" in c.id for c in fp32)
    with pytest.raises(KeyError):  # the stand-in does refuse what FlashInfer refuses
        fake_flashinfer.BatchPrefillWithPagedKVCacheWrapper(None).plan(
            *[torch.zeros(2, dtype=torch.int32)] * 4, 2, 1, 8, 4, q_data_type=torch.float32)


def test_without_its_plan_the_flashinfer_tree_refuses_the_step(flashinfer_attention):
    """Called outside the engine and the tasks (no ``plan_step``), the layer says what is missing."""
    from kernels_reference.forward_context import AttentionMetadata, set_forward_context
    layer = flashinfer_attention()(4, 8, 8 ** -0.5, 2)
    layer.kv_cache = (torch.zeros(4, 4, 2, 8), torch.zeros(4, 4, 2, 8))
    meta = AttentionMetadata.build([0], [3], block_size=4)
    with set_forward_context(meta), pytest.raises(RuntimeError, match="no plan for this step"):
        layer(torch.randn(3, 32), torch.randn(3, 16), torch.randn(3, 16))
