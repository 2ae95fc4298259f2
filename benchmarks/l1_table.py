"""Turn FastKernels JSON reports from a GPU run into the markdown tables under docs/perf/.

    python3 -m benchmarks l1_table REPORT.json [--identity IDENTITY.json] [--command "..."] > docs/perf/x.md
"""
import argparse
import json
import math
import statistics


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def load(path):
    data = json.load(open(path))
    return data.get("fastkernels", data)


def env_line(report):
    e = report["environment"]
    roof = e.get("roofline") or {}
    return (f"{e.get('gpu')} (driver {e.get('driver')}, SM clock {e.get('clock_sm')}), torch {e['torch']}, "
            f"triton {e['triton']}; measured at session start: copy {roof.get('copy_tbps', float('nan')):.2f} TB/s, "
            f"bf16 GEMM {roof.get('bf16_gemm_tflops', float('nan')):.0f} TFLOP/s")


def verdict_table(report):
    out = ["| task | status | cases passed | C_t | S_t (geomean speedup) |", "|---|---|---|---|---|"]
    for t in report["tasks"]:
        s = f"{t['S_t']:.3f}" if t["S_t"] else "-"
        out.append(f"| {t['name']} | {t['status']} | {t['cases_passed']}/{t['cases_total']} | {t['C_t']:.2f} | {s} |")
    m = report["macro"]
    S = f"{m['S']:.3f}" if m["S"] else "-"
    out.append("")
    out.append(f"MacroEval = S x C x Cov = {S} x {m['C']:.3f} x {m['Cov']:.3f} = **{m['MacroEval']:.3f}**")
    return out


def speed_table(report):
    out = ["| task | case | candidate us | reference us | speedup | cand spread | ref spread | "
           "candidate TB/s | roofline frac | mode |", "|---|---|---|---|---|---|---|---|---|---|"]
    for t in report["tasks"]:
        for s in t["speed"]:
            tb = f"{s['tbps']:.2f}" if s["tbps"] else "-"
            fr = f"{s['frac_roofline']:.2f}" if s["frac_roofline"] else "-"
            out.append(f"| {t['name']} | {s['case_id']} | {s['cand_us']:.2f} | {s['ref_us']:.2f} | "
                       f"{s['speedup']:.3f} | {s['cand_spread']:.3f} | {s['ref_spread']:.3f} | {tb} | {fr} | {s['mode']} |")
    return out


def noise_check(report):
    per_task = {t["name"]: geomean([s["speedup"] for s in t["speed"]]) for t in report["tasks"]}
    all_cases = [s["speedup"] for t in report["tasks"] for s in t["speed"]]
    med = statistics.median(per_task.values())
    out = ["| task | geomean speedup of the identical candidate | cases |", "|---|---|---|"]
    for t in report["tasks"]:
        out.append(f"| {t['name']} | {per_task[t['name']]:.4f} | {len(t['speed'])} |")
    out.append("")
    out.append(f"Median over tasks: **{med:.4f}** (target 1.00 +/- 0.03: "
               f"{'met' if abs(med - 1) <= 0.03 else 'MISSED'}). Over all {len(all_cases)} cases: median "
               f"{statistics.median(all_cases):.4f}, min {min(all_cases):.4f}, max {max(all_cases):.4f}.")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("report")
    ap.add_argument("--identity")
    ap.add_argument("--command", action="append", default=[])
    ap.add_argument("--title", default="FastKernels L1 suite on the H200")
    args = ap.parse_args()
    rep = load(args.report)
    lines = [f"# {args.title}", "", env_line(rep), "", "Commands (on the device machine, from the repo root):", ""]
    lines += [f"    {c}" for c in args.command] + [""]
    lines += ["## Verdicts and MacroEval (example Triton candidates)", ""] + verdict_table(rep) + [""]
    if args.identity:
        lines += ["## Timing-method noise check: the reference scored against an identical copy of itself",
                  "", "`--fk-candidate=kernels_reference` loads the reference tree as a candidate: same code, "
                  "separate instances, timed interleaved.", ""] + noise_check(load(args.identity)) + [""]
    lines += ["## Per-case timings (example Triton candidates vs reference)", "",
              "GPU time per call, median of the interleaved rounds; spread = IQR/median; "
              "TB/s from the task's minimum bytes.", ""] + speed_table(rep)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
