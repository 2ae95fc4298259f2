"""What the kernel level of the suite costs, per task and per kind of test.

Two subcommands:

``sample [--per-kind N] [--out FILE] [PYTEST ARGS...]``
    Collect the suite (full profile unless the arguments say otherwise) and write node ids that
    sample it: per task, N correctness and N speed cases spread over its case list (the first,
    the last and evenly between: the smallest and the largest shapes) and one fuzz test, breadth
    first (every task's first tests, then the next), so a run cut short has priced every task. Running
    that sample with ``--durations=0`` prices every kind of test of every task in one device call.

``table --report REPORT [--log LOG] [--fuzz-examples E] [--full-examples F] [PYTEST ARGS...]``
    Price the whole suite from the sample: per task, the mean seconds per test of each kind (the
    report's ``seconds_by_kind`` over ``tests_by_kind``, or pytest's ``--durations=0`` lines in LOG)
    times the number of such tests in a full collection (fuzz: per example, times F examples per
    fuzz test), with the sample's largest evaluation phases. A run cut short by a time limit still
    prices what it reached: the report is rewritten after every test.

``compare-speed REPORT REPORT...``
    The same speed tests run more than once (default timing, ``--fk-thorough``, default again):
    S_t, rounds and timing seconds per report, and how far each case's reference time moved.

The estimate is labelled as one: it is the sample's mean cost per test, not a full run.
"""
from __future__ import annotations

import argparse
import collections
import json
import math
import re
import subprocess
import sys
from typing import Dict, List

KINDS = ("correctness", "fuzz", "speed")
NODE = re.compile(r"^(tasks/L\d/test_(\w+)\.py)::test_(correctness|fuzz|speed)(\[.*\])?$")
DURATION = re.compile(r"^\s*([\d.]+)s\s+(setup|call|teardown)\s+(tasks/\S+::test_\w+(?:\[.*\])?)\s*$")


def plugin_args() -> List[str]:
    """``-p fk_pytest.plugin`` where the plugin is not installed (a checkout on PYTHONPATH, as on
    the device machine); an installed one registers itself, and naming it again is an error."""
    from importlib.metadata import entry_points
    installed = any(ep.value == "fk_pytest.plugin" for ep in entry_points(group="pytest11"))
    return [] if installed else ["-p", "fk_pytest.plugin"]


def collect(pytest_args: List[str]) -> List[str]:
    cmd = [sys.executable, "-m", "pytest", *plugin_args(), "tasks", "--collect-only", "-q", "-p", "no:cacheprovider",
           "-k", "not e2e", *pytest_args]
    if not any(a.startswith("--fk-profile") for a in pytest_args):
        cmd.append("--fk-profile=full")
    run = subprocess.run(cmd, capture_output=True, text=True, check=False)
    nodes = [line.strip() for line in run.stdout.splitlines() if NODE.match(line.strip())]
    if not nodes:  # never hand an empty sample on: pytest without test ids runs its whole default
        raise SystemExit(f"collecting the suite found no kernel-level test ({' '.join(cmd)}):\n"
                         + (run.stdout + run.stderr)[-2000:])
    return nodes


def by_task(nodes: List[str]) -> Dict[str, Dict[str, List[str]]]:
    tasks: Dict[str, Dict[str, List[str]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    for node in nodes:
        m = NODE.match(node)
        tasks[m.group(2)][m.group(3)].append(node)
    return tasks


def spread(items: List[str], n: int) -> List[str]:
    if len(items) <= n:
        return list(items)
    if n == 1:
        return [items[-1]]
    return [items[round(i * (len(items) - 1) / (n - 1))] for i in range(n)]


def sample(args, pytest_args) -> int:
    per_task = []
    for task, kinds in sorted(by_task(collect(pytest_args)).items()):
        fuzz = kinds.get("fuzz", [])
        correctness = spread(kinds.get("correctness", []), args.per_kind)
        speed = spread(kinds.get("speed", []), args.per_kind)
        one_fuzz = [next((f for f in fuzz if "bf16" in f), fuzz[0])] if fuzz else []
        per_task.append(correctness[:1] + speed[:1] + one_fuzz + correctness[1:] + speed[1:])
    # Breadth first: every task's first tests, then every task's next ones, so a run cut short by
    # its time limit has priced every task (pytest runs node ids in the order they are given).
    chosen = [t[i] for i in range(max(map(len, per_task), default=0)) for t in per_task if i < len(t)]
    text = "\n".join(chosen) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    print(f"{len(chosen)} tests sampled", file=sys.stderr)
    return 0


def sampled_costs(reports: List[str], log: str = None):
    """Per task: {kind: [seconds of each sampled test]} (from the reports' seconds_by_kind and
    tests_by_kind, as means; or pytest's --durations=0 lines in ``log``) and the phases."""
    seconds: Dict[str, Dict[str, List[float]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    phases: Dict[str, Dict[str, float]] = {}
    for path in reports:
        with open(path) as f:
            for t in json.load(f)["tasks"]:
                phases[t["name"]] = t.get("phases") or {}
                # The worker's start-up is billed to the first result after it (a task's first
                # test, a correctness one in a sample's order): a run pays it once, not per test.
                start = phases[t["name"]].get("worker_start", 0.0)
                for kind, n in (t.get("tests_by_kind") or {}).items():
                    if n and not log:
                        s = t["seconds_by_kind"][kind] - (start if kind == "correctness" else 0.0)
                        seconds[t["name"]][kind] += [max(s, 0.0) / n] * n
    if log:
        per_test: Dict[str, float] = collections.defaultdict(float)
        with open(log) as f:
            for line in f:
                m = DURATION.match(line)
                if m:
                    per_test[m.group(3)] += float(m.group(1))
        for node, s in per_test.items():
            m = NODE.match(node)
            if m:
                seconds[m.group(2)][m.group(3)].append(s)
    return seconds, phases


def table(args, pytest_args) -> int:
    full = {t: {k: len(v) for k, v in kinds.items()} for t, kinds in by_task(collect(pytest_args)).items()}
    seconds, phases = sampled_costs(args.report, args.log)
    rows, totals = [], collections.Counter()
    for task in sorted(full):
        est = {}
        for kind in KINDS:
            got = seconds[task].get(kind, [])
            if not got or not full[task].get(kind):
                continue
            mean = sum(got) / len(got)
            scale = args.full_examples / args.fuzz_examples if kind == "fuzz" else 1.0
            est[kind] = mean * scale * full[task][kind]
            totals[kind] += est[kind]
        sampled = sum(len(v) for v in seconds[task].values())
        top = sorted(phases.get(task, {}).items(), key=lambda kv: -kv[1])[:3]
        rows.append((task, full[task], sampled, est, top))
    print("| task | tests (corr/fuzz/speed) | sampled | est. correctness s | est. fuzz s | est. speed s | "
          "est. total s | sample's largest phases (s) |")
    print("|---|---|---|---|---|---|---|---|")
    for task, counts, sampled, est, top in sorted(rows, key=lambda r: -sum(r[3].values())):
        cells = [f"{est[k]:.0f}" if k in est else "-" for k in KINDS]
        print(f"| {task} | {'/'.join(str(counts.get(k, 0)) for k in KINDS)} | {sampled} | "
              + " | ".join(cells) + f" | {sum(est.values()):.0f} | "
              + ", ".join(f"{k} {v:.1f}" for k, v in top) + " |")
    print(f"| **all** | {sum(sum(c.values()) for c in full.values())} tests | "
          f"{sum(r[2] for r in rows)} | {totals['correctness']:.0f} | {totals['fuzz']:.0f} | "
          f"{totals['speed']:.0f} | **{sum(totals.values()):.0f}** | |")
    return 0


def compare_speed(args, pytest_args) -> int:
    """Two or more reports of the same speed tests: per task S_t and timing seconds in each, and how
    far the reference's time of each case moved between the first report and the others."""
    reports = []
    for path in args.reports:
        with open(path) as f:
            reports.append({t["name"]: t for t in json.load(f)["tasks"]})
    print("| task | report | rounds (sum) | S_t | S (weighted geomean of the speed cases) | warm-up s | capture s "
          "| timing s | ref_us vs first: max dev | cases > 10 us within 5% |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in sorted(reports[0]):
        first = {s["case_id"]: s for s in reports[0][name]["speed"]}
        for path, rep in zip(args.reports, reports):
            t = rep.get(name)
            if t is None:
                continue
            speed = {s["case_id"]: s for s in t["speed"]}
            devs = [(s["ref_us"] / first[c]["ref_us"] - 1, first[c]["ref_us"]) for c, s in speed.items()
                    if c in first and first[c]["ref_us"] > 0]
            big = [d for d, us in devs if us > 10]
            # warm-up: reports before the phase existed billed it to capture (0.0 here)
            warm, capture, timing = (sum((s.get("phases") or {}).get(p, 0.0) for s in t["speed"])
                                     for p in ("warm_up", "capture", "timing"))
            rounds = sum(s["rounds"] for s in t["speed"])
            s_t = f"{t['S_t']:.4f}" if t.get("S_t") is not None else "-"
            scored = [(s["weight"], s["speedup"]) for s in t["speed"] if s.get("speedup") and s.get("weight")]
            total = sum(w for w, _ in scored)
            geo = f"{math.exp(sum(w * math.log(x) for w, x in scored) / total):.4f}" if total else "-"
            print(f"| {name} | {path.rsplit('/', 1)[-1]} | {rounds} | {s_t} | {geo} | {warm:.1f} | {capture:.1f} | "
                  f"{timing:.1f} | "
                  f"{max((abs(d) for d, _ in devs), default=0):.3f} | "
                  f"{sum(abs(d) <= 0.05 for d in big)}/{len(big)} |")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample")
    s.add_argument("--per-kind", type=int, default=2)
    s.add_argument("--out")
    t = sub.add_parser("table")
    t.add_argument("--report", action="append", default=[], help="the sample's FastKernels report(s)")
    t.add_argument("--log", help="pytest output with --durations=0 (instead of the reports' seconds per kind)")
    t.add_argument("--fuzz-examples", type=float, default=2, help="examples per fuzz test in the sample")
    t.add_argument("--full-examples", type=float, default=25, help="examples per fuzz test in the run priced")
    c = sub.add_parser("compare-speed")
    c.add_argument("reports", nargs="+")
    args, pytest_args = parser.parse_known_args(argv)
    return {"sample": sample, "table": table, "compare-speed": compare_speed}[args.cmd](args, pytest_args)


if __name__ == "__main__":
    sys.exit(main())
