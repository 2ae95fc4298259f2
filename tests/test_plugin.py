"""The plugin as a user meets it: options, selection, reports, broken candidates, crashes."""
import json
import textwrap

from conftest import CANDIDATES, ROOT

# one small real case per L1 task and kind of the Llama family (gemma_rms_norm and rms_norm_gated
# also match "rms": other models' norms)
FAST = ["-k", "(rms or silu or rotary) and not deepseek and not gemma and not gated and T1-bf16 and not fuzz"]


def write_tree(root, files):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def read_report(path):
    report = json.loads(path.read_text())
    return report, {t["name"]: t for t in report["tasks"]}


def test_ids_and_selection(suite_run):
    result = suite_run("--collect-only", "-q", "-k", "rms and not gemma and not gated and not all_reduce")
    ids = [line for line in result.outlines if "::" in line]
    assert "tasks/L1/test_rms_norm.py::test_speed[llama-3.1-8b-decode-T1-bf16]" in ids
    assert "tasks/L1/test_rms_norm.py::test_correctness[qwen3-8b-decode-T7-q-norm-bf16]" in ids
    assert "tasks/L1/test_rms_norm.py::test_fuzz[fp32]" in ids
    assert all("test_rms_norm.py" in i for i in ids)

    by_marker = suite_run("--collect-only", "-q", "-m", "rope")
    assert {line.split("::")[0] for line in by_marker.outlines if "::" in line} == {
        "tasks/L1/test_rotary_emb.py", "tasks/L1/test_deepseek_rotary_emb.py", "tasks/L1/test_rope_2d.py"}
    level = suite_run("--collect-only", "-q", "-m", "level1")
    assert len([line for line in level.outlines if "::" in line]) > 100


def test_benchmark_only_runs_only_speed_tests(suite_run, tmp_path):
    report = tmp_path / "r.json"
    result = suite_run("-k", "silu and T1-bf16", "--benchmark-only", f"--fk-report={report}",
                       "-p", "no:randomly")
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) == 4 and outcomes.get("skipped", 0) >= 4
    _, tasks = read_report(report)
    assert len(tasks["silu_and_mul"]["speed"]) == 4 and tasks["silu_and_mul"]["cases"] == []


def test_report_schema_and_table(suite_run, tmp_path):
    report_path, html = tmp_path / "out" / "r.json", tmp_path / "r.html"
    bench = tmp_path / "bench.json"
    result = suite_run(*FAST, f"--fk-candidate={ROOT / 'examples/candidates/triton'}",
                       f"--fk-report={report_path}", f"--fk-html={html}", f"--benchmark-json={bench}",
                       "--benchmark-enable", "--fk-benchmark-cpu")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*FastKernels MacroEval*", "KERNEL LEVEL: 3 tasks on cpu, cpu profile*",
                                 "*rms_norm*L1*norm*PASSED*", "kernel-level MacroEval = S x C x Cov = *",
                                 "note: no GPU timing in this run: S is not measured*"])
    report, tasks = read_report(report_path)
    assert report["schema"] == "fastkernels.report/1" and report["complete"] is True
    assert report["run"]["candidate"]["kind"] == "tree" and len(report["run"]["candidate"]["sha256"]) == 64
    assert report["environment"]["torch"] and report["environment"]["device"] == "cpu"
    assert set(tasks) == {"rms_norm", "silu_and_mul", "rotary_emb"}
    rms = tasks["rms_norm"]
    assert rms["status"] == "PASSED" and rms["valid"] and rms["C_t"] == 1.0
    assert rms["S_t"] is None and rms["informational_cpu_speedup"] > 0  # CPU: not a GPU timing
    assert rms["cases_total"] == len(rms["cases"]) > 0 and rms["swapped_modules"] == ["RMSNorm"]
    assert {"e_ref", "e_cand", "floor", "ratio", "elem_ratio"} <= set(rms["cases"][0]["outputs"][0])
    speed = rms["speed"][0]
    assert speed["informational"] and speed["mode"] == "cpu-wall" and speed["bytes"] > 0
    macro = report["macro"]
    assert macro["C"] == 1.0 and macro["Cov"] == 1.0 and macro["S"] is None and macro["MacroEval"] == 1.0
    assert set(macro["families"]) == {"norm", "activation", "rope"}
    assert "MacroEval" in html.read_text() and "<svg" in html.read_text()
    embedded = json.loads(bench.read_text())
    assert embedded["fastkernels"]["schema"] == "fastkernels.report/1"
    assert any(b["extra_info"].get("speedup") for b in embedded["benchmarks"])


BROKEN_A = {
    "L1/rms_norm.py": """
        class RMSNormFast:  # the class the task needs is missing
            pass
        """,
    "L1/silu_and_mul.py": "import module_that_does_not_exist\n",
    "L1/rotary_emb.py": """
        from kernels_reference.L1.rotary_emb import RotaryEmbedding as R
        class RotaryEmbedding(R):
            def forward(self, positions, q, k):  # renamed parameters
                return super().forward(positions, q, k)
        """,
}
BROKEN_B = {
    "L1/rms_norm.py": """
        import torch
        from torch import nn
        class RMSNorm(nn.Module):
            def __init__(self, hidden_size: int, eps: float = 1e-6):
                super().__init__()
                self.scale = nn.Parameter(torch.ones(hidden_size))  # not 'weight'
            def forward(self, x, residual=None):
                return x
        """,
    "L1/silu_and_mul.py": """
        from torch import nn
        class SiluAndMul(nn.Module):
            def __init__(self):
                super().__init__()
            def forward(self, x):
                raise RuntimeError("kernel launch failed: too many resources requested")
        """,
    "L1/rotary_emb.py": """
        from kernels_reference.L1.rotary_emb import RotaryEmbedding as R
        class RotaryEmbedding(R):
            def forward(self, positions, query, key):
                q, k = self.forward_native(positions, query, key)
                return q[:, 1:], k
        """,
}
BROKEN_C = {
    "L1/rms_norm.py": """
        from kernels_reference.L1.rms_norm import RMSNorm as R
        class RMSNorm(R):
            def forward(self, x, residual=None):
                out = self.forward_native(x, residual)
                if residual is not None:
                    return out
                x.copy_(out)  # in place, but the plain norm's input is the layer's residual
                return out
        """,
    "L1/silu_and_mul.py": """
        import torch
        from torch import nn
        import torch.nn.functional as F
        class SiluAndMul(nn.Module):
            def __init__(self):
                super().__init__()
            def forward(self, x):
                d = x.shape[-1] // 2
                out = torch.empty(*x.shape[:-1], d, dtype=x.dtype, device=x.device)
                half = d // 2  # forgets the second half of every row
                out[..., :half] = (F.silu(x[..., :half].float()) * x[..., d:d + half].float()).to(x.dtype)
                return out
        """,
    "L1/rotary_emb.py": """
        from kernels_reference.L1.rotary_emb import RotaryEmbedding as R
        class RotaryEmbedding(R):
            def forward(self, positions, query, key):
                q, k = self.forward_native(positions, query, key)
                return q.float(), k
        """,
}


def test_broken_candidates_get_named_statuses_and_the_run_goes_on(suite_run, tmp_path):
    expected = {
        "a": (BROKEN_A, {"rms_norm": "MISSING_CLASS", "silu_and_mul": "IMPORT_ERROR",
                         "rotary_emb": "SIGNATURE_MISMATCH"}),
        "b": (BROKEN_B, {"rms_norm": "STATE_DICT_MISMATCH", "silu_and_mul": "RUNTIME_ERROR",
                         "rotary_emb": "WRONG_SHAPE"}),
        "c": (BROKEN_C, {"rms_norm": "INPUT_MUTATED", "silu_and_mul": "UNWRITTEN_OUTPUT",
                         "rotary_emb": "WRONG_DTYPE"}),
    }
    for name, (files, statuses) in expected.items():
        tree = write_tree(tmp_path / name, files)
        report_path = tmp_path / f"{name}.json"
        result = suite_run(*FAST, f"--fk-candidate={tree}", f"--fk-report={report_path}")
        assert result.ret == 1, name
        report, tasks = read_report(report_path)
        assert report["complete"] is True
        assert {t: tasks[t]["status"] for t in statuses} == statuses, {t: tasks[t]["message"] for t in tasks}
        for t in statuses:
            assert tasks[t]["message"] and not tasks[t]["valid"] and tasks[t]["S_t"] is None
        assert report["macro"]["Cov"] == 0.0 and report["macro"]["MacroEval"] == 0.0
        result.stdout.fnmatch_lines([f"*{statuses['rms_norm']}*"])


def test_partial_tree_and_single_file(suite_run, tmp_path):
    tree = write_tree(tmp_path / "partial", {"L1/silu_and_mul.py": (
        ROOT / "examples/candidates/triton/L1/silu_and_mul.py").read_text()})
    report_path = tmp_path / "partial.json"
    result = suite_run(*FAST, f"--fk-candidate={tree}", f"--fk-report={report_path}", "-rs")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*not attempted: no L1/rms_norm.py in the candidate tree*"])
    report, tasks = read_report(report_path)
    assert tasks["silu_and_mul"]["status"] == "PASSED"
    assert tasks["rms_norm"]["status"] == tasks["rotary_emb"]["status"] == "NOT_ATTEMPTED"
    assert abs(report["macro"]["Cov"] - 1 / 3) < 1e-9

    single = tmp_path / "my_kernels.py"
    single.write_text((CANDIDATES / "rope_ignores_positions/L1/rotary_emb.py").read_text())
    report_path = tmp_path / "single.json"
    result = suite_run(*FAST, f"--fk-candidate={single}", f"--fk-report={report_path}")
    report, tasks = read_report(report_path)
    assert report["run"]["candidate"]["kind"] == "file"
    assert tasks["rotary_emb"]["status"] == "WRONG_RESULT"
    assert tasks["rms_norm"]["status"] == "NOT_ATTEMPTED"


def test_fuzz_catches_a_width_hardcoded_kernel_on_shapes_no_workload_lists(suite_run, tmp_path):
    report_path = tmp_path / "r.json"
    result = suite_run("-k", "rms and fuzz and bf16", "--fk-fuzz-examples=12",
                       f"--fk-candidate={CANDIDATES / 'rms_width_4096'}", f"--fk-report={report_path}")
    assert result.ret == 1
    _, tasks = read_report(report_path)
    failing = [c for c in tasks["rms_norm"]["cases"] if c["status"] != "PASSED"]
    assert failing and all(c["kind"] == "fuzz" and c["params"]["hidden"] != 4096 for c in failing)


def test_fuzz_is_deterministic_and_fk_seed_changes_the_shapes(suite_run, tmp_path):
    def fuzz_ids(*extra):
        path = tmp_path / f"r{len(list(tmp_path.iterdir()))}.json"
        suite_run("-k", "silu and fuzz and fp16", f"--fk-report={path}", *extra)
        return [c["case"] for c in read_report(path)[1]["silu_and_mul"]["cases"]]

    first, again = fuzz_ids(), fuzz_ids()
    assert first == again and len(first) >= 4
    seeded = fuzz_ids("--fk-seed=7")
    assert seeded != first


def test_a_gpu_worker_that_ran_out_of_memory_is_replaced():
    """An out-of-memory failure on the GPU ends the sterile child after its reply, so the next case
    gets the whole GPU back; on the CPU nothing restarts for it."""
    from fk_pytest.worker import _memory_stuck

    oom = ("RUNTIME_ERROR", "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")
    assert _memory_stuck("cuda", ["candidate_error", oom])
    assert _memory_stuck("cuda", ["task_error", "the task failed before the candidate ran: " + oom[1]])
    assert not _memory_stuck("cpu", ["candidate_error", oom])


def test_report_survives_a_crashing_candidate(suite_run, tmp_path):
    tree = write_tree(tmp_path / "crash", {
        "L1/rms_norm.py": (ROOT / "examples/candidates/triton/L1/rms_norm.py").read_text(),
        "L1/silu_and_mul.py": """
            import os
            from torch import nn
            class SiluAndMul(nn.Module):
                def __init__(self):
                    super().__init__()
                def forward(self, x):
                    os.abort()  # what a heap corruption in the Triton interpreter looks like
            """,
    })
    # Isolated (the default): the crash costs the crashing task, the run goes on to a full report.
    report_path = tmp_path / "r.json"
    result = suite_run("-k", "T1-bf16 and not fuzz and (rms or silu)", f"--fk-candidate={tree}",
                       f"--fk-report={report_path}", "-p", "no:randomly")
    assert result.ret == 1
    report, tasks = read_report(report_path)
    assert report["complete"] is True
    assert tasks["rms_norm"]["status"] == "PASSED"
    assert tasks["silu_and_mul"]["status"] == "RUNTIME_ERROR" and "SIGABRT" in tasks["silu_and_mul"]["message"]

    # Not isolated: the process dies, and the report rewritten after every test keeps what finished
    # (a pytest process of its own: the crash would end this one).
    report_path = tmp_path / "r2.json"
    result = suite_run("-k", "T1-bf16 and not fuzz and (rms or silu)", f"--fk-candidate={tree}",
                       f"--fk-report={report_path}", "-p", "no:randomly", "--fk-isolation=none",
                       subprocess=True)
    assert result.ret != 0
    report, tasks = read_report(report_path)
    assert report["complete"] is False
    assert tasks["rms_norm"]["status"] == "PASSED" and tasks["rms_norm"]["cases_total"] > 0


def test_usage_errors(suite_run, tmp_path):
    result = suite_run(f"--fk-candidate={tmp_path / 'missing'}")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*--fk-candidate*does not exist*"])
    import torch
    if not torch.cuda.is_available():
        result = suite_run("--fk-device=cuda", "--collect-only")
        assert result.ret == 4
        result.stderr.fnmatch_lines(["*no CUDA device*"])


def test_use_from_another_repo(pytester, monkeypatch):
    """A kernel repo's own tests use the installed plugin's cases and calibrated check."""
    monkeypatch.setenv("PYTHONPATH", f"{ROOT / 'src'}:{ROOT}")
    pytester.makepyfile(test_my_kernels="""
        import pytest
        import torch
        from fk_pytest import workload_cases

        class RMSNorm(torch.nn.Module):  # the repo's own kernel, same interface as vLLM's
            def __init__(self, hidden_size: int, eps: float = 1e-6):
                super().__init__()
                self.variance_epsilon = eps
                self.weight = torch.nn.Parameter(torch.ones(hidden_size))
            def forward(self, x, residual=None):
                if residual is not None:
                    x = (x.float() + residual.float()).to(x.dtype)
                    residual = x
                xf = x.float()
                y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
                y = y.to(x.dtype) * self.weight
                return y if residual is None else (y, residual)

        class Broken(RMSNorm):
            def forward(self, x, residual=None):
                out = super().forward(x, residual)
                return out * 1.01 if residual is None else (out[0] * 1.01, out[1])

        CASES = [c for c in workload_cases("rms_norm", "cpu") if "decode" in c.id]

        @pytest.mark.parametrize("case", CASES, ids=str)
        def test_rms_norm(case, fk_check):
            fk_check("rms_norm", case, RMSNorm)

        @pytest.mark.parametrize("case", CASES[:1], ids=str)
        def test_broken_is_caught(case, fk_check):
            with pytest.raises(pytest.fail.Exception, match="WRONG_RESULT"):
                fk_check("rms_norm", case, Broken)
        """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--fk-device=cpu")
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) > 5 and "failed" not in outcomes


def test_cpu_timings_stay_out_of_the_benchmark_table_unless_asked(suite_run):
    result = suite_run("-k", "silu and T1-bf16 and speed", "--benchmark-enable")
    assert result.ret == 0
    assert "benchmark 'silu_and_mul'" not in result.stdout.str()  # no pytest-benchmark table
    result.stdout.fnmatch_lines(["CPU timings are the Triton interpreter's wall time*--fk-benchmark-cpu*"])
    shown = suite_run("-k", "silu and T1-bf16 and speed", "--benchmark-enable", "--fk-benchmark-cpu")
    shown.stdout.fnmatch_lines(["*benchmark 'silu_and_mul'*"])


def test_xdist_workers_merge_into_one_report_equal_to_a_serial_run(suite_run, tmp_path):
    """Verdicts (a wrong kernel among right ones) and cases come out the same with -n 2."""
    # Decode cases only (both tasks, both models, correctness and speed kinds): the prefill and
    # sweep cases added 24 interpreted tests to each of the two runs and no other kind of verdict.
    select = ["-k", "(rms_norm or silu_and_mul) and (llama-3.1-8b or qwen2.5-7b) and decode and not fuzz"]
    tree = CANDIDATES / "rms_width_4096"  # wrong on Qwen2.5's 3584-wide rows
    reports = {}
    for name, extra in (("serial", []), ("parallel", ["-n", "2"])):
        path = tmp_path / f"{name}.json"
        result = suite_run(*select, f"--fk-candidate={tree}", f"--fk-report={path}", *extra)
        assert result.ret == 1  # the wrong kernel fails its cases either way
        reports[name] = read_report(path)
    (serial, s_tasks), (parallel, p_tasks) = reports["serial"], reports["parallel"]
    assert parallel["complete"] is True and set(p_tasks) == set(s_tasks) == {"rms_norm", "silu_and_mul"}

    def verdicts(tasks):
        return {n: (t["status"], t["C_t"], sorted((c["kind"], c["case"], c["seed"], c["status"]) for c in t["cases"]))
                for n, t in tasks.items()}
    assert verdicts(p_tasks) == verdicts(s_tasks)
    assert s_tasks["rms_norm"]["status"] == "WRONG_RESULT" and s_tasks["silu_and_mul"]["status"] == "NOT_ATTEMPTED"
    assert parallel["macro"]["MacroEval"] == serial["macro"]["MacroEval"]


def test_progress_writes_of_the_report_take_a_bounded_share_of_the_run(tmp_path, monkeypatch):
    """The report is rewritten while a run goes on, but a rewrite that costs T waits 9 T before
    the next one (each rebuilds the whole, growing report: rewritten after every test, they
    starved xdist's controller); the final write always happens."""
    from fk_pytest import session as session_module
    from fk_pytest.session import FKSession

    fk = FKSession(device="cpu", candidate=None, mode="independent", profile="cpu", seed=None,
                   report_path=str(tmp_path / "r.json"))
    writes = []
    now = [100.0]
    monkeypatch.setattr(session_module.time, "monotonic", lambda: now[0])

    def slow_write(complete):
        writes.append(complete)
        now[0] += 0.05  # a rewrite that takes 50 ms
    monkeypatch.setattr(fk, "write", slow_write)
    for _ in range(100):  # 100 tests of 10 ms each
        fk.write_progress()
        now[0] += 0.01
    # 1 s of tests plus the rewrites: each 0.05 s rewrite buys 0.45 s of quiet, so 3, not 100
    assert len(writes) == 3 and not any(writes)
