"""The peer benchmark (fk-peers) on the CPU: JSON structure, wrong peers excluded, the ratio math,
case selection, attention peers around the paged cache, and the command line."""
import dataclasses
import io
import json
import math
import sys

import pytest
import torch

from conftest import ROOT
from fk_pytest import get_task
from fk_pytest.peers import (FRAMEWORK, PRODUCTION, REFERENCE, SCHEMA, Options, Peer, Target, benchmark, case_verdict,
                             main, op_summary, select_cases, suite_ops, suite_peers_module, to_markdown)


@pytest.fixture(autouse=True)
def no_interpreter(monkeypatch):
    # Liger's kernels would otherwise run in Triton's interpreter (the plugin turns it on for CPU
    # runs); these tests want them skipped, deterministically.
    monkeypatch.setenv("TRITON_INTERPRET", "0")


def _cpu(**kw):
    return Options(device=torch.device("cpu"), profile="cpu", compile=False, **kw)


def _one_percent_off(ctx):
    module, task = ctx.reference, ctx.task

    def wrong(inputs):
        out = task.call(module, inputs, "forward_native")
        return (out[0] * 1.01, out[1]) if isinstance(out, tuple) else out * 1.01

    return wrong


def test_cpu_run_structure_and_a_wrong_peer_is_excluded(tmp_path):
    spec = suite_ops()["rms_norm"]
    ops = {"rms_norm": dataclasses.replace(spec, peers=spec.peers + (Peer("off", "1% too large", _one_percent_off),))}
    path = tmp_path / "peers.json"
    progress = io.StringIO()
    doc = benchmark(_cpu(), ["rms_norm"], keyword="llama and T7 and fused", max_cases=1, ops=ops,
                    json_path=str(path), progress=progress)

    assert doc["schema"] == SCHEMA and doc["complete"] is True
    assert json.loads(path.read_text())["ops"][0]["cases"][0]["case"] == doc["ops"][0]["cases"][0]["case"]
    assert doc["environment"]["torch"] == torch.__version__ and doc["run"]["device"] == "cpu"
    (op,) = doc["ops"]
    assert op["op"] == "rms_norm" and [p["name"] for p in op["peers"]] == ["eager", "compile", "liger", "off"]
    (case,) = op["cases"]
    assert case["case"] == "llama-3.1-8b-decode-T7-fused-add-bf16"
    assert case["same_as"] == ["mistral-7b-v0.3-decode-T7-fused-add-bf16"]  # identical shape, measured once
    impls = case["impls"]
    assert list(impls)[0] == REFERENCE and impls[REFERENCE]["status"] == "ok" and impls[REFERENCE]["us"] > 0
    assert impls[REFERENCE]["mode"] == "cpu-wall" and impls[REFERENCE]["roofline_frac"] is None
    assert impls["eager"]["status"] == "ok" and impls["eager"]["us"] > 0 and impls["eager"]["error_ratio"] <= 1.0
    assert impls["eager"]["tbps"] == pytest.approx(case["bytes"] / impls["eager"]["us"] / 1e6)
    assert impls["compile"]["status"] == "skipped" and "--no-compile" in impls["compile"]["reason"]
    assert impls["liger"]["status"] == "skipped" and "GPU" in impls["liger"]["reason"]
    # The wrong peer is reported, never timed, never best.
    assert impls["off"]["status"] == "wrong" and "us" not in impls["off"] and impls["off"]["error_ratio"] > 2
    assert case["best_peer"] == "eager"
    assert case["ratio"] == pytest.approx(impls["eager"]["us"] / impls[REFERENCE]["us"])
    s = op["summary"]
    assert s["geomean_ratio"] == pytest.approx(case["ratio"]) and s["min_ratio_case"] == case["case"]
    assert s["informational"] is True
    assert s["targets"][0]["held"] is None and "no case" in s["targets"][0]["note"]  # T7 < 16384 tokens
    assert "rms_norm llama-3.1-8b-decode-T7-fused-add-bf16" in progress.getvalue()

    # Kinds: the eager peer is the framework's; no production kernel ran here (Liger needs a GPU).
    assert {p["name"]: p["kind"] for p in op["peers"]} == {"eager": FRAMEWORK, "compile": FRAMEWORK,
                                                           "liger": PRODUCTION, "off": FRAMEWORK}
    assert op["peers"][0]["version"] == f"torch {torch.__version__}"
    assert case["by_kind"][FRAMEWORK]["best_peer"] == "eager" and case["by_kind"][PRODUCTION]["ratio"] is None
    assert s["by_kind"][PRODUCTION]["geomean_ratio"] is None
    assert s["by_kind"][FRAMEWORK]["geomean_ratio"] == pytest.approx(case["ratio"])

    md = to_markdown(doc, "fk-peers ...")
    assert "## rms_norm" in md and "| llama-3.1-8b-decode-T7-fused-add-bf16" in md
    assert "wrong [" in md and "off: wrong: out: error" in md
    assert "vs production kernels" in md and "**liger** (production, " in md


def test_case_verdict_and_op_summary_math():
    impls = {REFERENCE: {"status": "ok", "us": 10.0, "bw_frac": 0.9},
             "eager": {"status": "ok", "us": 12.0},
             "compile": {"status": "ok", "us": 8.5},
             "cheat": {"status": "wrong", "us": 1.0},  # fastest, but wrong: never best
             "liger": {"status": "skipped"}}
    v = case_verdict(impls)
    assert v == {"best_peer": "compile", "best_peer_us": 8.5, "ratio": pytest.approx(0.85)}
    # Per kind: the production kernels' best apart from the framework's (the cheat is never best).
    by_kind = case_verdict(impls, {"eager": FRAMEWORK, "compile": FRAMEWORK, "cheat": PRODUCTION,
                                   "liger": PRODUCTION})["by_kind"]
    assert by_kind[FRAMEWORK] == {"best_peer": "compile", "best_peer_us": 8.5, "ratio": pytest.approx(0.85)}
    assert by_kind[PRODUCTION] == {"best_peer": None, "best_peer_us": None, "ratio": None}
    impls["liger"] = {"status": "ok", "us": 11.0}
    assert case_verdict(impls, {"liger": PRODUCTION})["by_kind"][PRODUCTION]["ratio"] == pytest.approx(1.1)
    assert case_verdict({REFERENCE: {"status": "ok", "us": 1.0}, "x": {"status": "unsupported"}})["ratio"] is None

    big = Target("bw", 0.85, lambda c: c.params["tokens"] >= 100)
    mk = lambda cid, tokens: dataclasses.replace(get_task("rms_norm").cases("cpu")[0], id=cid,  # noqa: E731
                                                 params={"tokens": tokens})
    cases = {"a": mk("a", 200), "b": mk("b", 1)}
    records = [{"case": "a", "ratio": 1.2, "impls": {REFERENCE: {"bw_frac": 0.9}}},
               {"case": "b", "ratio": 0.95, "impls": {REFERENCE: {"bw_frac": 0.1}}}]
    records[0]["by_kind"] = {PRODUCTION: {"ratio": 1.5}, FRAMEWORK: {"ratio": 1.2}}
    records[1]["by_kind"] = {PRODUCTION: {"ratio": None}, FRAMEWORK: {"ratio": 0.95}}
    s = op_summary(records, [big], cases, informational=False)
    assert s["by_kind"][PRODUCTION] == {"cases_with_ratio": 1, "geomean_ratio": pytest.approx(1.5), "min_ratio": 1.5,
                                        "min_ratio_case": "a"}
    assert s["by_kind"][FRAMEWORK]["geomean_ratio"] == pytest.approx(math.sqrt(1.2 * 0.95))
    assert s["geomean_ratio"] == pytest.approx(math.sqrt(1.2 * 0.95))
    assert s["min_ratio"] == 0.95 and s["min_ratio_case"] == "b"
    assert s["ratio_target"]["held"] is True  # geomean 1.068 >= 1.0, no shape under 0.9
    assert s["targets"][0] == {"name": "bw", "min_bw_frac": 0.85, "metric": "bw_frac", "cases": 1, "worst_bw_frac": 0.9,
                               "worst_case": "a", "held": True, "note": ""}
    assert s["all_held"] is True

    records[1]["ratio"] = 0.85  # geomean still >= 1 (1.0100), but one shape under 0.9
    records[0]["impls"][REFERENCE]["bw_frac"] = 0.8
    s = op_summary(records, [big], cases, informational=False)
    assert s["geomean_ratio"] > 1.0 and s["ratio_target"]["held"] is False
    assert s["ratio_target"]["within_noise"] is False  # 0.85 < 0.9 * 0.97
    records[1]["ratio"] = 0.89
    assert op_summary(records, [big], cases, informational=False)["ratio_target"] == {
        "geomean_min": 1.0, "shape_min": 0.9, "held": False, "within_noise": True, "noise": 0.03}
    records[1]["ratio"] = 0.85
    assert s["targets"][0]["held"] is False and s["all_held"] is False
    s = op_summary([], [big], cases, informational=True)
    assert s["geomean_ratio"] is None and s["ratio_target"]["held"] is None and s["all_held"] is None


def test_selection_dedupes_filters_and_puts_target_cases_first():
    task, spec = get_task("rms_norm"), suite_ops()["rms_norm"]
    everything = select_cases(task, spec, "full")
    ids = [s.case.id for s in everything]
    assert all(s.case.dtype == torch.bfloat16 for s in everything)  # the dtype sweep is not a peer case
    assert "llama-3.1-8b-prefill-T16384-bf16" in ids and "mistral-7b-v0.3-prefill-T16384-bf16" not in ids
    merged = next(s for s in everything if s.case.id == "llama-3.1-8b-prefill-T16384-bf16")
    assert merged.same_as == ["mistral-7b-v0.3-prefill-T16384-bf16"]
    assert len(ids) == len(set(ids))

    capped = select_cases(task, spec, "full", max_cases=4)
    assert len(capped) == 4 and spec.targets[0].applies(capped[0].case)
    assert not all(spec.targets[0].applies(s.case) for s in capped)  # the rest of the range too

    picked = select_cases(task, spec, "full", keyword="qwen3 and T1- and not q-norm and not k-norm")
    assert {s.case.id for s in picked} == {"qwen3-8b-decode-T1-bf16", "qwen3-8b-decode-T1-fused-add-bf16"}

    attention = select_cases(get_task("attention"), suite_ops()["attention"], "full", max_cases=3)
    assert [s.case.id for s in attention][:2] == ["llama-3.1-8b-decode-B32-C1280-bf16",
                                                  "llama-3.1-8b-decode-B1-C8192-bf16"]
    assert {"qwen3-8b-decode-B1-C8192-bf16", "mistral-7b-v0.3-decode-B1-C8192-bf16"} <= set(attention[1].same_as)
    assert attention[2].case.params.get("source") == "captured"  # then the captured serving steps


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_attention_peers_store_gather_and_attend_or_say_why():
    doc = benchmark(_cpu(), ["attention"], keyword="llama", max_cases=2, progress=io.StringIO())
    cases = {c["case"]: c for c in doc["ops"][0]["cases"]}
    assert set(cases) == {"llama-3.1-8b-decode-B3-bf16", "llama-3.1-8b-prefill-B2-chunked-bf16"}
    for case in cases.values():
        impls = case["impls"]
        # The KV cache a step writes is checked like an output: these peers did the whole layer's job.
        for name in ("eager", "sdpa-flash", "flex"):
            assert impls[name]["status"] == "ok", (name, impls[name])
            assert impls[name]["error_ratio"] <= 2.0
        for name, backend in (("sdpa-efficient", "EFFICIENT"), ("sdpa-cudnn", "CUDNN")):
            # no such kernel on the CPU: said, not a crash
            assert impls[name]["status"] == "unsupported" and backend in impls[name]["reason"]
        assert impls["compile"]["status"] == "skipped"
        assert case["best_peer"] in ("eager", "sdpa-flash", "flex") and case["ratio"] > 0


def test_bottom_right_mask_of_a_continued_chunk():
    from kernels_reference.forward_context import AttentionMetadata
    PackedLayout = suite_peers_module().PackedLayout

    meta = AttentionMetadata.build([0, 3], [2, 2], block_size=4)
    layout = PackedLayout(meta, torch.device("cpu"))
    assert layout.q_start == [0, 2, 4] and layout.kv_start == [0, 2, 7]
    assert layout.kv_pos.tolist() == [0, 1, 0, 1, 2, 3, 4] and layout.q_pos.tolist() == [0, 1, 3, 4]
    assert layout.bottom_right_mask(1).tolist() == [[True, True, True, True, False], [True] * 5]
    # Slots through the block tables: sequence 1 starts in the block after sequence 0's.
    assert layout.slots(meta.block_tables).tolist() == [0, 1, 4, 5, 6, 7, 8]


def test_flashinfer_page_table_addresses_the_same_slots_as_the_block_tables():
    """The page table handed to FlashInfer's plan reproduces every cached token's slot: sequences with
    scattered blocks, a full last page, a one-token sequence, block tables padded past their used pages."""
    from kernels_reference.forward_context import AttentionMetadata
    peers = suite_peers_module()
    tables = [[7, 2, 9], [4], [0, 5, 8, 1]]
    meta = AttentionMetadata.build([5, 0, 9], [3, 1, 7], block_size=4, block_tables=tables)
    indptr, indices, last = peers.page_table(meta)
    assert indptr.tolist() == [0, 2, 3, 7] and indices.tolist() == [7, 2, 4, 0, 5, 8, 1]
    assert last.tolist() == [4, 1, 4] and indptr.dtype == indices.dtype == last.dtype == torch.int32
    slots = []
    for i, n in enumerate(meta.seq_lens_cpu):
        pages = indices[indptr[i]:indptr[i + 1]].tolist()
        assert (len(pages) - 1) * 4 + last[i] == n
        slots += [pages[p // 4] * 4 + p % 4 for p in range(n)]
    assert slots == peers.PackedLayout(meta, torch.device("cpu")).slots(meta.block_tables).tolist()


@pytest.mark.parametrize("op, peer, keyword", [
    ("attention", "flashinfer", "llama and prefill"),
    ("attention", "flashinfer-decode-tc", "llama and decode"),
    ("mla_attention", "flashinfer-mla", "decode"),
])
def test_flashinfer_peers_hand_it_the_task_cache_and_page_table(monkeypatch, op, peer, keyword):
    """Each FlashInfer peer, with torch stand-ins for its wrappers, gives the reference's answer on
    the task's own cache: the page table, the head layout and (MLA) the absorption are right; a
    wrong page table is caught by the same check."""
    from fakes import flashinfer as fake  # torch stand-ins for FlashInfer's wrappers
    peers = suite_peers_module()
    monkeypatch.setattr(peers, "flashinfer_module", lambda ctx: fake)
    spec = suite_ops()[op]
    chosen = [p for p in spec.peers if p.name == peer]
    task = get_task(op)
    sel = select_cases(task, spec, "cpu", keyword=keyword, max_cases=1)[0]
    from fk_pytest.peers import measure_case
    record = measure_case(task, sel.case, chosen, _cpu())
    assert record["impls"][peer]["status"] == "ok", record["impls"][peer]
    real = peers.page_table
    monkeypatch.setattr(peers, "page_table", lambda meta: (lambda t: (t[0], t[1].flip(0), t[2]))(real(meta)))
    record = measure_case(task, sel.case, chosen, _cpu())
    assert record["impls"][peer]["status"] == "wrong", record["impls"][peer]


@pytest.mark.parametrize("keyword", ["llama and prefill", "qwen2.5 and decode"])
def test_flash_attn_4_peer_hands_it_the_block_tables_and_lengths(monkeypatch, keyword):
    """The FlashAttention 4 peer, with a torch stand-in for its varlen function, gives the
    reference's answer on the task's paged cache (block tables as its page table, lengths as
    seqused_k, GQA); a stand-in that reads past each sequence's length is caught by the check."""
    from fakes import flash_attn_cute as fake
    peers = suite_peers_module()
    monkeypatch.setattr(peers, "flash_attn_cute_module", lambda ctx: fake)
    spec = suite_ops()["attention"]
    chosen = [p for p in spec.peers if p.name == "flash-attn-4"]
    task = get_task("attention")
    sel = select_cases(task, spec, "cpu", keyword=keyword, max_cases=1)[0]
    from fk_pytest.peers import measure_case
    assert measure_case(task, sel.case, chosen, _cpu())["impls"]["flash-attn-4"]["status"] == "ok"
    monkeypatch.setattr(fake, "IGNORE_SEQUSED", True)
    assert measure_case(task, sel.case, chosen, _cpu())["impls"]["flash-attn-4"]["status"] == "wrong"


def test_command_line(tmp_path, capsys):
    js, md = tmp_path / "p.json", tmp_path / "p.md"
    rc = main(["--device", "cpu", "--ops", "silu_and_mul", "-k", "qwen3 and decode-T1-", "--max-cases-per-op", "1",
               "--no-compile", "--json", str(js), "--md", str(md)])
    out = capsys.readouterr()
    assert rc == 0 and "silu_and_mul" in out.out and "ratio = best peer time / reference time" in out.out
    assert "silu_and_mul qwen3-8b-decode-T1-bf16" in out.err  # one progress line per case
    assert json.loads(js.read_text())["ops"][0]["cases"][0]["case"] == "qwen3-8b-decode-T1-bf16"
    assert md.read_text().startswith("# Peer benchmark") and "## silu_and_mul" in md.read_text()

    assert main(["--device", "cpu", "--ops", "no_such_op", "--no-compile"]) == 2
    assert "no peer definitions for no_such_op" in capsys.readouterr().err
    # --peers keeps the named peers only, and refuses a name no selected op has.
    assert main(["--list", "--ops", "attention", "--peers", "flex,flashinfer", "--max-cases-per-op", "1"]) == 0
    assert "attention: peers flex, flashinfer\n" in capsys.readouterr().out
    assert main(["--list", "--ops", "rms_norm", "--peers", "flashinfer"]) == 2
    assert "--peers names no peer of the selected ops: flashinfer" in capsys.readouterr().err
    assert main(["--list", "--profile", "full", "--ops", "attention", "--max-cases-per-op", "2"]) == 0
    assert "decode-B32-C1280" in capsys.readouterr().out  # a batch >= 32 decode case first: a target judges it


# The encoder and vision ops: on one small bf16 case each (the padded batch for multi_head_attention:
# its mask is what the peers must handle), every peer runs and passes the task's check, or says why
# it cannot run on the CPU. eager must pass everywhere; compile is off here (Inductor's CPU compile
# takes seconds a graph).
ENCODER_PEERS_ON_CPU = {
    "layer_norm": {"F.layer_norm": "ok", "liger": "skipped"},
    "gelu": {"F.gelu": "ok"},
    "pooler": {},
    "encoder_only_attention": {"sdpa-flash": "ok", "sdpa-cudnn": "unsupported", "sdpa-efficient": "unsupported",
                               "flex": "ok", "varlen_attn": "skipped"},
    "multi_head_attention": {"sdpa-flash": "unsupported", "sdpa-cudnn": "unsupported",
                             "sdpa-efficient": "unsupported", "flex": "ok"},
    "patch_embed": {"conv2d": "ok", "conv2d-channels-last": "ok"},
    "dinov2_position_embedding": {},
    "global_response_norm": {},
    "convnext_dwconv_norm": {"conv2d": "ok", "conv2d-channels-last": "ok"},
}
# Why each peer that does not run here does not (a word of its reason).
NOT_RUN_BECAUSE = {"compile": "--no-compile", "liger": "GPU", "varlen_attn": "CUDA", "sdpa-cudnn": "CUDNN",
                   "sdpa-efficient": "EFFICIENT"}


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("op", list(ENCODER_PEERS_ON_CPU))
def test_encoder_and_vision_peers_pass_or_say_why(op):
    from fk_pytest.peers import measure_case

    task, spec = get_task(op), suite_ops()[op]
    assert [p.name for p in spec.peers[:2]] == ["eager", "compile"]
    selected = select_cases(task, spec, "cpu", keyword="padded" if op == "multi_head_attention" else None)
    case = min((s.case for s in selected), key=lambda c: task.io_bytes(c) + task.flops(c))
    assert case.dtype == torch.bfloat16
    impls = measure_case(task, case, spec.peers, _cpu())["impls"]
    expected = {"eager": "ok", "compile": "skipped", **ENCODER_PEERS_ON_CPU[op]}
    assert {name: impls[name]["status"] for name in expected} == expected, impls
    assert set(impls) == {REFERENCE, *expected}
    for name, status in expected.items():
        if status == "ok":
            assert impls[name]["error_ratio"] <= 2.0, (name, impls[name])
        else:
            reason = impls[name]["reason"]
            assert NOT_RUN_BECAUSE.get(name, "mask") in reason, (name, reason)  # flash: no mask


def test_encoder_and_vision_peer_cases_and_bandwidth_targets():
    """The full profile's bf16 cases only; the bandwidth targets judge the big batches."""
    judged = {"layer_norm": "dinov2-small-batch-T32800-bf16", "gelu": "bge-m3-batch-T16384-erf-bf16",
              "global_response_norm": "convnextv2-tiny-224px-stage2-28x28x768-B32-bf16",
              "dinov2_position_embedding": "dinov2-small-448px-B32-bf16"}
    ops = suite_ops()
    for op in ENCODER_PEERS_ON_CPU:
        task, spec = get_task(op), ops[op]
        selected = select_cases(task, spec, "full")
        assert selected and all(s.case.dtype == torch.bfloat16 for s in selected)
        if op in judged:
            (target,) = spec.targets
            assert judged[op] in {s.case.id for s in selected if target.applies(s.case)}
            assert not all(target.applies(s.case) for s in selected)  # one image, one query: not judged
    # Mean pooling only; no full batch is large enough to be judged on bandwidth.
    (pooler_target,) = ops["pooler"].targets
    assert not any(pooler_target.applies(s.case) for s in select_cases(get_task("pooler"), ops["pooler"], "full"))
    for op in ("encoder_only_attention", "multi_head_attention", "patch_embed", "convnext_dwconv_norm"):
        assert ops[op].targets == ()


def test_serving_decode_targets_cover_every_kv_layout_and_the_state_updates():
    """Paged decode at batch >= 32 is held to 85% of copy for 4 and 8 KV heads and MLA's latent cache,
    at any context; a recurrent state update at batch >= 32 to 70%; batch 1-6 is not judged so."""
    ops = suite_ops()
    # The dense table's ops: no case more than 5% behind a peer; attention none behind production.
    assert all(ops[op].shape_floor == 0.95 for op in ("rms_norm", "silu_and_mul", "rotary_emb", "attention",
                                                     "mla_attention", "qkv_parallel_linear"))
    assert ops["attention"].production_floor == ops["mla_attention"].production_floor == 1.0
    assert ops["mamba_chunk_scan"].shape_floor is None and ops["rms_norm"].production_floor is None
    wide = {op: [t for t in ops[op].targets if t.min_bw_frac == 0.85 and "decode" in t.name]
            for op in ("attention", "mla_attention")}
    for op, (target,) in wide.items():
        judged = {c.id for c in get_task(op).cases("full") if target.applies(c)}
        batches = {int(cid.split("-decode-B")[1].split("-")[0]) for cid in judged}
        assert batches == {32, 139}, (op, judged)
        assert any("-C1280-" in cid for cid in judged) and any("-C2048-" in cid for cid in judged)
    assert {"qwen2.5-7b-decode-B32-C2048-bf16", "llama-3.1-8b-decode-B139-C1152-bf16"} <= {  # 4 and 8 KV heads
        c.id for c in get_task("attention").cases("full") if wide["attention"][0].applies(c)}
    for op in ("selective_state_update", "gated_delta_rule", "gated_linear_attention", "rwkv7"):
        (target,) = ops[op].targets
        assert target.min_bw_frac == 0.70
        judged = [c.id for c in get_task(op).cases("full") if target.applies(c)]
        # hand-picked (B32, B128, B256) or captured (the state models' decode representatives)
        batches = [int(cid.split("-decode-B")[1].split("-")[0]) for cid in judged if "-decode-B" in cid]
        assert judged and len(batches) == len(judged) and min(batches) >= 32, (op, judged)
        assert not any(target.applies(c) for c in get_task(op).cases("full") if "-decode-B1-" in c.id)


def test_an_op_floor_and_the_production_floor_can_each_fail_the_op():
    cases = {}
    records = [{"case": "a", "ratio": 1.2, "impls": {REFERENCE: {}},
                "by_kind": {PRODUCTION: {"ratio": 1.2}, FRAMEWORK: {"ratio": 3.0}}},
               {"case": "b", "ratio": 0.93, "impls": {REFERENCE: {}},
                "by_kind": {PRODUCTION: {"ratio": 0.93}, FRAMEWORK: {"ratio": 2.0}}}]
    assert op_summary(records, [], cases, informational=False)["ratio_target"]["held"] is True  # 0.93 >= 0.9
    strict = op_summary(records, [], cases, informational=False, shape_floor=0.95)
    assert strict["ratio_target"]["held"] is False and strict["ratio_target"]["shape_min"] == 0.95
    assert strict["all_held"] is False
    prod = op_summary(records, [], cases, informational=False, production_floor=1.0)
    assert prod["ratio_target"]["held"] is True
    assert prod["production_target"] == {"case_min": 1.0, "held": False, "min_ratio": 0.93, "min_ratio_case": "b"}
    assert prod["all_held"] is False
    records[1]["by_kind"][PRODUCTION]["ratio"] = None  # no production peer ran on b: judged on a alone
    assert op_summary(records, [], cases, informational=False, production_floor=1.0)["production_target"]["held"]
    for r in records:
        r["by_kind"][PRODUCTION]["ratio"] = None  # none ran anywhere: nothing to hold, not a pass
    none_ran = op_summary(records, [], cases, informational=False, production_floor=1.0)
    assert none_ran["production_target"]["held"] is None and none_ran["all_held"] is None


@pytest.mark.parametrize("keyword, runs", [("qwen3", {"fla-fused", "fla", "mamba-ssm"}),  # norm, then gate
                                           ("mamba2", {"fla", "mamba-ssm"})])  # gate, then groups' norm
def test_gated_norm_peers_hand_the_libraries_the_gate_groups_and_norm_side(monkeypatch, keyword, runs):
    """FLA's and mamba-ssm's gated RMSNorm peers, with torch stand-ins for their functions, give the
    reference's answer on both models' forms; FusedRMSNormGated says it does not compute Mamba-2's;
    a stand-in gating on the wrong side of the norm is caught by the task's check."""
    from fakes import gated_norm as fake
    peers = suite_peers_module()
    monkeypatch.setattr(peers, "_fla_norm", lambda ctx, module: fake)
    monkeypatch.setattr(peers, "_mamba_triton", lambda ctx, module: fake)
    spec, task = suite_ops()["rms_norm_gated"], get_task("rms_norm_gated")
    chosen = [p for p in spec.peers if p.name in ("fla-fused", "fla", "mamba-ssm")]
    assert len(chosen) == 3
    sel = select_cases(task, spec, "cpu", keyword=keyword, max_cases=1)[0]
    from fk_pytest.peers import measure_case
    record = measure_case(task, sel.case, chosen, _cpu())
    assert {n for n in runs if record["impls"][n]["status"] == "ok"} == runs, record["impls"]
    if "fla-fused" not in runs:
        assert record["impls"]["fla-fused"]["status"] == "unsupported"
        assert "gates first" in record["impls"]["fla-fused"]["reason"]
    monkeypatch.setattr(fake, "GATE_SIDE_SWAPPED", True)
    record = measure_case(task, sel.case, chosen, _cpu())
    assert all(record["impls"][n]["status"] == "wrong" for n in runs), record["impls"]


def test_the_linear_attention_norms_conv_and_2d_rope_have_peers():
    ops = suite_ops()
    names = {op: [p.name for p in ops[op].peers] for op in ("rms_norm_gated", "gemma_rms_norm", "short_convolution",
                                                            "rope_2d")}
    assert names["rms_norm_gated"] == ["eager", "compile", "fla-fused", "fla", "mamba-ssm"]
    assert names["gemma_rms_norm"] == ["eager", "compile", "liger"]
    assert names["short_convolution"] == names["rope_2d"] == ["eager", "compile"]


PAGED_READ_CHECK = """
import torch
from fk_pytest import get_task
from tasks import read_ceilings
task = get_task("attention")
for case in [c for c in task.cases("cpu") if "-decode-" in c.id][:2]:
    inputs = task.make_inputs(case, torch.Generator().manual_seed(0), torch.device("cpu"))
    meta, k, v = inputs["metadata"], inputs["k_cache_0"], inputs["v_cache_0"]
    want = sum(float(c[meta.block_tables[i, : -(-n // k.shape[1])].long()].double().sum())
               for i, n in enumerate(meta.seq_lens_cpu) for c in (k, v))
    got = float(read_ceilings.paged_read(inputs).double().sum())
    assert abs(got - want) <= 1e-5 * abs(want), (case.id, got, want)
print("paged read ok")
"""


def test_the_paged_read_sums_exactly_each_sequence_s_cached_blocks():
    """The Triton paged read, in the interpreter (a process of its own, where TRITON_INTERPRET is set
    before Triton defines any kernel): every cached block of every sequence through its block table."""
    import os
    import subprocess

    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "src")]))
    out = subprocess.run([sys.executable, "-c", PAGED_READ_CHECK], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and "paged read ok" in out.stdout, out.stderr[-2000:]


def test_paged_decode_is_held_to_the_fastest_read_of_its_own_bytes(monkeypatch):
    """The B1 long-context decode target is a fraction of the fastest read of the case's bytes, timed
    in the same loop as the reference: its ``ceiling_frac`` is the fastest read's time over its own;
    no read is a peer or enters the ratio."""
    from fk_pytest.peers import Ceiling, measure_case

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    spec, task = suite_ops()["attention"], get_task("attention")
    (long_target,) = [t for t in spec.targets if t.metric == "ceiling_frac"]
    assert long_target.min_bw_frac == 0.9 and [c.name for c in spec.ceilings] == ["paged", "contiguous"]
    decode = next(c for c in task.cases("cpu") if "-decode-" in c.id and len(c["context"]) > 1)
    case = dataclasses.replace(decode, id=decode.id.replace("-decode-", "-decode-B1-C8192-x-"))
    assert long_target.applies(case) and not long_target.applies(decode)
    assert all(c.applies(case) and not c.applies(decode) for c in spec.ceilings)
    # The contiguous read (torch) and a slower one beside it: the fraction is the faster's.
    contiguous = next(c for c in spec.ceilings if c.name == "contiguous")
    slow = Ceiling("twice", "the contiguous read twice", lambda ctx: (lambda inputs: [contiguous.build(ctx)(inputs)
                                                                                       for _ in range(2)]),
                   contiguous.applies)
    record = measure_case(task, case, [], _cpu(), ceilings=[contiguous, slow])
    assert set(record["ceilings"]) == {"contiguous", "twice"}
    assert all(r["status"] == "ok" and r["us"] > 0 for r in record["ceilings"].values())
    ref = record["impls"][REFERENCE]
    assert ref["ceiling_frac"] == pytest.approx(min(r["us"] for r in record["ceilings"].values()) / ref["us"])
    assert set(record["impls"]) == {REFERENCE} and record["best_peer"] is None


def test_a_time_under_the_roofline_floor_is_timed_again_then_flagged_and_left_out(monkeypatch):
    """A peer (or the reference) whose time implies more than the machine's measured copy or GEMM
    rate is timed a second time; still under 85% of the floor, it is ``suspect``: its time kept
    for reading, its rates dropped, and no ratio or target uses it."""
    from fk_pytest.peers import measure
    from fk_pytest.peers.text import progress_line
    from fk_pytest.timing import Timing

    task = get_task("rms_norm")
    case = task.cases("cpu")[0]
    peer = Peer("eager-copy", "the reference's native path",
                lambda ctx: (lambda inputs: ctx.task.call(ctx.reference, inputs, "forward_native")), FRAMEWORK)
    rounds = []

    def fake_time(timed, sets, opts, flusher, more_sets=None):
        rounds.append(sorted(timed))
        us = {REFERENCE: 50.0, "eager-copy": 0.001}  # the peer's time no GPU could give
        return {n: Timing(us[n], 0.0, 10, "cuda-graph", [us[n]] * 10) for n in timed}, {}

    monkeypatch.setattr(measure, "_time", fake_time)
    floor_us = 1.0
    roofline = {"copy_tbps": task.io_bytes(case) / (floor_us * 1e-6) / 1e12, "bf16_gemm_tflops": 1e9}
    record = measure.measure_case(task, case, [peer], _cpu(), roofline=roofline)
    assert len(rounds) == 2  # timed again once
    flagged, ref = record["impls"]["eager-copy"], record["impls"][REFERENCE]
    assert flagged["status"] == "suspect" and "under 85% of the case's roofline floor 1.000 us" in flagged["reason"]
    assert flagged["bw_frac"] is None and flagged["us"] == 0.001
    assert ref["status"] == "ok" and ref["bw_frac"] == pytest.approx(floor_us / 50.0)
    assert record["best_peer"] is None and record["ratio"] is None
    assert "eager-copy 0.00us (suspect)" in progress_line("rms_norm", record)

    rounds.clear()
    roofline = {"copy_tbps": 1e9, "bf16_gemm_tflops": 1e9}  # a floor far below both: timed once, both records
    record = measure.measure_case(task, case, [peer], _cpu(), roofline=roofline)
    assert len(rounds) == 1 and record["best_peer"] == "eager-copy" and record["impls"]["eager-copy"]["status"] == "ok"
