"""Sterile evaluation: every hack in tests/candidates/hacks_* is caught and named; crashes, hangs
and interrupts leave the run and its report intact. (CUDA-only guards: benchmarks/guards.py, step `guards` of benchmarks/gpu_steps.sh.)"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import CANDIDATES, EXAMPLES, ROOT

ONE_CASE = ["-k", "(rms or silu or rotary) and (llama-3.1-8b-decode-T1-bf16 or "
                  "(qwen2.5-7b-decode-T1-fused-add-bf16 and correctness))"]


def run_tree(suite_run, tmp_path, tree, *extra):
    report = tmp_path / f"{tree}.json"
    result = suite_run(*ONE_CASE, f"--fk-candidate={CANDIDATES / tree}", f"--fk-report={report}", *extra)
    data = json.loads(report.read_text())
    return result, data, {t["name"]: t for t in data["tasks"]}


def test_late_thread_zeros_and_replayed_outputs_are_named(suite_run, tmp_path):
    result, report, tasks = run_tree(suite_run, tmp_path, "hacks_a")
    assert {n: t["status"] for n, t in tasks.items()} == {
        "rms_norm": "WORK_ESCAPED", "silu_and_mul": "CONSTANT_OUTPUT", "rotary_emb": "REPLAYED_OUTPUT"}
    assert "late-writer" in tasks["rms_norm"]["message"] or "changed after" in tasks["rms_norm"]["message"]
    assert "constant 0" in tasks["silu_and_mul"]["message"]
    assert report["complete"] and result.ret == 1


def test_patched_clock_input_view_and_timed_path_cheat_are_named(suite_run, tmp_path):
    result, report, tasks = run_tree(suite_run, tmp_path, "hacks_b")
    assert {n: t["status"] for n, t in tasks.items()} == {
        "rms_norm": "TAMPERED", "silu_and_mul": "OUTPUT_ALIASES_INPUT", "rotary_emb": "TIMED_OUTPUT_WRONG"}
    assert "time.perf_counter" in tasks["rms_norm"]["message"]
    # The timed-path cheat passed its correctness cases: only the check of what was timed catches it.
    rope_cases = tasks["rotary_emb"]["cases"]
    assert any(c["kind"] == "workload" and c["status"] == "PASSED" for c in rope_cases)
    assert any(c["kind"] == "speed" and c["status"] == "TIMED_OUTPUT_WRONG" for c in rope_cases)


def test_delegation_crash_and_hang_end_only_their_task(suite_run, tmp_path):
    # The hang costs one time limit. The run's other requests took at most 2.0 s each with the
    # other core busy (a fresh worker's imports and the candidate's load): 6 s leaves them 3x that.
    started = time.monotonic()
    result, report, tasks = run_tree(suite_run, tmp_path, "hacks_c", "--fk-timeout=6")
    assert {n: t["status"] for n, t in tasks.items()} == {
        "rms_norm": "DELEGATED", "silu_and_mul": "RUNTIME_ERROR", "rotary_emb": "TIMEOUT"}
    assert "SIGABRT" in tasks["silu_and_mul"]["message"]
    assert "rms_norm.forward" in " ".join(tasks["rms_norm"]["delegated"])
    assert not tasks["rms_norm"]["valid"] and tasks["rms_norm"]["C_t"] == 1.0
    assert report["complete"] is True
    assert time.monotonic() - started < 150  # a hang costs one time limit, not one per case


def test_out_of_bounds_store_in_the_interpreter_costs_one_task(suite_run, tmp_path):
    tree = tmp_path / "oob"
    (tree / "L1").mkdir(parents=True)
    (tree / "L1" / "silu_and_mul.py").write_text((CANDIDATES / "hacks_oob/L1/silu_and_mul.py").read_text())
    (tree / "L1" / "rms_norm.py").write_text((EXAMPLES / "L1/rms_norm.py").read_text())
    report = tmp_path / "r.json"
    suite_run(*ONE_CASE, f"--fk-candidate={tree}", f"--fk-report={report}")
    tasks = {t["name"]: t for t in json.loads(report.read_text())["tasks"]}
    assert tasks["silu_and_mul"]["status"] == "RUNTIME_ERROR"
    assert tasks["rms_norm"]["status"] == "PASSED"


def test_honest_candidates_are_not_flagged(suite_run, tmp_path):
    report = tmp_path / "r.json"
    result = suite_run(*ONE_CASE, f"--fk-candidate={EXAMPLES}", f"--fk-report={report}")
    tasks = json.loads(report.read_text())["tasks"]
    assert result.ret == 0 and {t["status"] for t in tasks} == {"PASSED"}
    assert all(t["delegated"] == [] for t in tasks)


def _terminal_sigint():
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_interrupted_run_still_writes_its_report(tmp_path):
    report = tmp_path / "r.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", str(ROOT / "tasks"), "-p", "no:cacheprovider", "-q",
         "--benchmark-disable", "--fk-device=cpu", f"--fk-candidate={EXAMPLES}", f"--fk-report={report}",
         "-k", "not e2e",  # minutes of work: the run cannot finish before the interrupt
         f"--rootdir={ROOT}", "-p", "no:randomly"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        # An xdist worker ignores SIGINT and a child inherits that (Python then installs no
        # KeyboardInterrupt handler), and a signal mask blocking it would be inherited too: give
        # the run the disposition and mask a user's terminal gives it.
        preexec_fn=_terminal_sigint)

    def finished_tasks():
        try:
            return len(json.loads(report.read_text())["tasks"])
        except (OSError, ValueError):
            return 0

    deadline = time.monotonic() + 180
    while finished_tasks() == 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert proc.poll() is None, "the run ended before it could be interrupted: select more work"
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=120)[0].decode(errors="replace")
    data = json.loads(report.read_text())
    assert data["complete"] is False, f"the interrupt did not end the run (exit {proc.returncode}):\n{out[-1500:]}"
    assert data["tasks"]  # what finished before the interrupt is kept


def test_time_below_the_roofline_is_a_suspect_not_a_record():
    """The roofline rule itself (no honest kernel can break it, so it is tested on numbers)."""
    from fk_pytest.speed import _result
    from fk_pytest.timing import Timing
    from fk_pytest.registry import get_task

    task = get_task("silu_and_mul")
    case = next(c for c in task.cases("full") if c.id == "llama-3.1-8b-prefill-T16384-bf16")
    roofline = {"copy_tbps": 4.2, "bf16_gemm_tflops": 750.0}
    floor_us = task.io_bytes(case) / 4.2e12 * 1e6  # about 335 us for 1.4 GB

    def timed(us):
        return Timing(us, 0.01, 100, "cuda-graph", [us] * 100)

    honest = _result(task, case, timed(floor_us * 1.1), timed(floor_us * 1.2), roofline)
    assert not honest.suspect and 0.85 < honest.frac_roofline < 1.0
    cheat = _result(task, case, timed(floor_us * 0.5), timed(floor_us * 1.2), roofline)
    assert cheat.suspect and cheat.frac_roofline > 1.9


SWALLOWS_CTRL_C = '''
import os, signal, time


def test_swallows_ctrl_c():
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(2)
    except KeyboardInterrupt:
        pass  # what a broad except, or a finaliser that caught the signal, does with it


def test_after_the_interrupt():
    pass
'''


def test_a_swallowed_interrupt_still_marks_the_report_incomplete_and_stops_the_run(tmp_path):
    swallow = tmp_path / "test_swallow.py"
    swallow.write_text(SWALLOWS_CTRL_C)
    report = tmp_path / "r.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(ROOT / "tasks" / "L1" / "test_silu_and_mul.py"), str(swallow),
         "-k", "correctness or swallows or after", "-p", "no:cacheprovider", "-v", "--benchmark-disable",
         "--fk-device=cpu", f"--fk-candidate={EXAMPLES}", f"--fk-report={report}", f"--rootdir={ROOT}",
         "-p", "no:randomly"], env=env, capture_output=True, text=True, timeout=300, preexec_fn=_terminal_sigint)
    out = done.stdout + done.stderr
    data = json.loads(report.read_text())
    assert data["tasks"], out[-1500:]  # the verdicts before the interrupt are kept
    assert data["complete"] is False, out[-1500:]
    assert "test_after_the_interrupt" not in out, out[-1500:]  # the run stopped at the interrupt


def test_a_candidate_running_a_moved_reference_kernel_is_traced():
    """Reference kernels live under kernels_reference/ops, outside the task's module file: a candidate
    that calls one (here the attention task's KV store in Triton and its native causal attention)
    still ran the reference's code. The same kernels reached through a reference child module are
    the normal independent-mode case and are not delegation."""
    import torch

    from fk_pytest.guards import ReferenceTracer, reference_kernel_files
    from kernels_reference.L1.attention import Attention
    from kernels_reference.ops.attention.native import causal_attention
    from kernels_reference.ops.kv_store.store import store_kv_cache_triton

    kernels = {Path(f).relative_to(ROOT).as_posix() for f in reference_kernel_files("L1/attention.py")}
    assert {"kernels_reference/ops/attention/fast.py", "kernels_reference/ops/paged_decode/decode.py",
            "kernels_reference/ops/paged_decode/blocks.py", "kernels_reference/ops/kv_store/store.py"} <= kernels
    assert reference_kernel_files("L2/llama_attention.py") == frozenset()  # it uses modules, not kernels

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, n, 16, generator=gen) for n in (4, 2, 2))
    with ReferenceTracer(True, "L1/attention.py") as tracer:
        causal_attention(q, k, v, 0, 0.25)
    assert tracer.hits == {"ops.attention.native.causal_attention"}

    if os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available():
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        caches = [torch.zeros(4, 16, 2, 16, device=dev) for _ in "kv"]
        with ReferenceTracer(True, "L1/attention.py") as tracer:
            store_kv_cache_triton(k.to(dev), v.to(dev), *caches, torch.tensor([0, 1, 5], device=dev))
        assert "ops.kv_store.store._store_kv_kernel (Triton kernel)" in tracer.hits

    with ReferenceTracer(True, "L1/mla_attention.py") as tracer:  # MLA's kernels include causal_attention
        Attention(4, 16, 0.25, 2).forward_native(q.reshape(3, -1), k.reshape(3, -1), v.reshape(3, -1))
    assert tracer.hits == set()  # ... but here the reference Attention child called it
