"""CUDA-only guards on a GPU: run the suite on tests/candidates/gpu_* and check each verdict.

    python3 -m benchmarks guards OUT_DIR     (on the device machine, from the repo root)
"""
import json
import os
import subprocess
import sys

EXPECTED = {
    "gpu_a": {"rms_norm": "WORK_ESCAPED", "rotary_emb": "TIMED_OUTPUT_WRONG"},
    "hacks_oob": {"silu_and_mul": "RUNTIME_ERROR"},  # an out-of-bounds store: illegal address on a GPU
    "gpu_b": {"silu_and_mul": "TAMPERED"},
    "../../examples/candidates/triton": {"rms_norm": "PASSED", "silu_and_mul": "PASSED", "rotary_emb": "PASSED"},
}


def main(out):
    rows, ok = [], True
    for tree, expected in EXPECTED.items():
        name = os.path.basename(tree)
        report = os.path.join(out, f"guards-{name}.json")
        cmd = [sys.executable, "-m", "pytest", "-p", "fk_pytest.plugin", "tasks", "-q", "--fk-device=cuda",
               "-k", "llama-3.1-8b-decode-T1-bf16 or llama-3.1-8b-prefill-T16384-bf16",
               f"--fk-candidate=tests/candidates/{tree}", f"--fk-report={report}", "--fk-timeout=120"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        tasks = {t["name"]: t for t in json.load(open(report))["tasks"]}
        for task, want in expected.items():
            got = tasks[task]["status"]
            ok &= got == want
            rows.append(f"| {name} | {task} | {want} | {got} | {tasks[task]['message'][:160]} |")
        print(proc.stdout[-1500:])
    print("| candidate tree | task | expected | got | message |\n|---|---|---|---|---|")
    print("\n".join(rows))
    print("ALL GUARDS CAUGHT" if ok else "SOME GUARD MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "out"))
