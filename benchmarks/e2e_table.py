"""The end-to-end table of FastKernels reports as markdown: per case both scoring paths' d, g and
allowance, the credit, each built-in mutant's d, caught/run with the smallest margin, the speedups
and the decode-forced run's engine steps. With ``--noise``: per model, each kind of noise run's
flip rate (its flipped over its compared tokens, pooled over the model's scenarios, each run scored
on the positions the other runs keep), the statistic ``g`` is the largest of.

    python3 -m benchmarks e2e_table docs/perf/h200-e2e-decode/continuations/*.json
    python3 -m benchmarks e2e_table --noise docs/perf/h100-2026-12-07f/e2e-example-mixtral-deepseek.json
"""
import argparse
import json
import sys

from fk_pytest.e2e import PATHS, Tally, pooled_noise
from fk_pytest.report import floor_setters
SHORT = {"rope-ignores-positions": "rope", "rms-norm-old-residual": "res", "silu-and-mul-halves-swapped": "silu",
         "topk-expert-off-by-one": "topk", "rms-norm-eps-1000x": "eps", "attention-scale-10pct-low": "scale",
         "kv-store-decode-slot-off-by-one": "slot", "paged-decode-one-token-short": "short",
         "rope-wrong-in-decode": "rope-dec"}


def _num(x, fmt=".3f"):
    return "-" if x is None else format(x, fmt)


def rows(report: dict):
    for c in report["e2e"]["cases"]:
        if c["status"] == "NOT_RUN" or not c.get("paths"):
            continue
        paths, mutants = c["paths"], c["mutants"]
        if not set(PATHS) <= set(paths):  # an embedding case: its paths are statistics of embeddings
            print(f"{c['case_id']}: not a decoder case (paths {', '.join(paths)}), left out", file=sys.stderr)
            continue
        ran = [m for m in mutants.values() if m.get("d") is not None]
        cells = []
        for name in SHORT:
            m = mutants.get(name)
            if not m or m.get("d") is None:
                cells.append("-")
            else:  # bold: not caught
                cells.append(_num(m["d"], ".2f") if m["caught"] else f"**{_num(m['d'], '.2f')}**")
        steps = paths["decode-forced"].get("steps", {})
        tokens = f"{c['compared_tokens']}/{c['output_tokens']}" if c.get("compared_tokens") else str(c["output_tokens"])
        yield ([c["case_id"], c["status"], tokens]
               + [" / ".join(_num(paths[p][k]) for p in PATHS) for k in ("d", "g", "allowance")]
               + [floor_setters(c, " / ") or "-"]
               + [f"{c['credit']:.2f}"] + cells
               + [f"{sum(m['caught'] for m in ran)}/{len(ran)} {_num(c['min_mutant_margin'], '+.2f')}",
                  _num(c.get("speedup_throughput")), _num(c.get("speedup_latency")),
                  ", ".join(f"{k} {n}" for k, n in sorted(steps.items()))])


def noise_rates(report: dict) -> dict:
    """model -> {"run/path": Tally pooled over its scenarios (fk_pytest.e2e.pooled_noise)}, from the
    first case of each model that carries its noise runs (every case of a model holds the same)."""
    out = {}
    for c in report["e2e"]["cases"]:
        if c.get("model") in out or not c.get("noise"):
            continue
        tallies = {}
        for key, per_request in c["noise"].items():
            compared = c["noise_compared"][key]
            flipped = [round(d * n) for d, n in zip(per_request, compared)]
            tallies[key] = Tally(sum(flipped), sum(compared), list(per_request), list(compared))
        out[c["model"]] = dict(sorted(pooled_noise(tallies).items()))
    return out


def print_noise(reports) -> None:
    print("| model | noise run | flipped / compared | rate |")
    print("|---|---|---|---|")
    for report in reports:
        for model, runs in noise_rates(report).items():
            for run, t in runs.items():
                print(f"| {model} | {run} | {t.flipped} / {t.compared} | {t.d:.3f} |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+")
    parser.add_argument("--noise", action="store_true", help="each kind of noise run's pooled flip rate per model")
    args = parser.parse_args(argv)
    if args.noise:
        reports = []
        for path in args.reports:
            with open(path) as f:
                reports.append(json.load(f))
        print_noise(reports)
        return 0
    head = (["e2e case", "status", "tokens stable/all", "d pre / dec", "g pre / dec", "allowance pre / dec",
             "g set by (pre / dec)", "credit"]
            + list(SHORT.values()) + ["mutants caught, margin", "thr x", "lat x", "decode-forced steps"])
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for path in args.reports:
        with open(path) as f:
            report = json.load(f)
        for row in rows(report):
            print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
