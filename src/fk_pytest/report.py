"""The versioned JSON report, the end-of-run table and the HTML page (schema: docs/report-schema.md).

The report is rewritten atomically as the run goes (``FKSession.write_progress``), so a run that
dies half-way (a crashed interpreter, a killed job) leaves a readable report of what finished up
to the last rewrite, marked
``"complete": false``. ``fk-report r.json`` prints the table of any report again.
"""
from __future__ import annotations

import argparse
import html
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterable, Optional

from . import plots
from .render import fmt as _fmt, html_page, text_table as _table
from .macro import e2e_macro_eval, macro_eval
from .phases import total
from .results import TaskRecord
from .schema import SCHEMA_ID, InvalidReport, load_report

SCHEMA = SCHEMA_ID  # the schema file: report.schema.json (fk_pytest.schema validates against it)
# Additive changes bump the minor version only (the schema string stays, so readers keep working):
# 1.1 added the end-to-end section "e2e"; 1.2 the built-in mutants and pooled noise of e2e cases,
# failed composed classes per task, and the amortised timing's calls per replay / one-call times;
# 1.3 the suite that ran (run.suite: version, commit, dirty), for the leaderboard's grouping;
# 1.4 both scoring paths of an e2e case (path, paths: prefill-forced and decode-forced), the
# mutants' kind, paths and catch_at, and g as the largest mean of a noise run; 1.5 e2e runs scored
# on the stable positions only (compared_tokens, noise_compared, paths' g_run) and g as the largest
# pooled flip rate of a kind of noise run; 1.7 embedding e2e cases (paths cosine and retrieval-rank,
# unit "ranks").
SCHEMA_VERSION = "1.7"


def environment(device: str, roofline: Optional[dict]) -> dict:
    import torch

    env = {"python": platform.python_version(), "platform": platform.platform(),
           "torch": torch.__version__, "device": device}
    try:
        import triton
        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    from .compare import triton_interpreter_active
    env["triton_interpreter"] = triton_interpreter_active()
    if device == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, gpu_count=torch.cuda.device_count(), cuda=torch.version.cuda,
                   sm_count=props.multi_processor_count,
                   capability=f"{props.major}.{props.minor}")
        env.update(_nvidia_smi())
    env["roofline"] = roofline
    return env


def _nvidia_smi() -> dict:
    fields = "driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.limit"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10).stdout.splitlines()[0]
    except Exception:
        return {}
    return dict(zip(["driver", "clock_sm", "clock_mem", "clock_sm_max", "power_limit"],
                    [v.strip() for v in out.split(",")]))


def build_report(records: Iterable[TaskRecord], *, run: dict, env: dict, complete: bool,
                 e2e: Iterable = ()) -> dict:
    records = sorted(records, key=lambda r: (r.level, r.family, r.name))
    report = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "complete": complete, "run": run,
              "environment": env, "tasks": [r.as_json() for r in records], "macro": macro_eval(records)}
    report["phases"] = total(t["phases"] for t in report["tasks"])
    e2e = sorted(e2e, key=lambda r: (r.family, r.model, r.scenario))
    if e2e:
        report["e2e"] = {"cases": [r.as_json() for r in e2e], "macro": e2e_macro_eval(e2e)}
    return report


def write_json(report: dict, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(report, f, indent=1, default=str)
    os.replace(tmp, path)


def _where(report: dict) -> str:
    """One phrase: which device and profile produced the numbers."""
    run = report.get("run") or {}
    device, profile = run.get("device", "?"), run.get("profile", "?")
    shapes = {"cpu": "small real shapes", "full": "production shapes"}.get(profile, "")
    interp = ", Triton interpreted" if (report.get("environment") or {}).get("triton_interpreter") else ""
    return f"{device}, {profile} profile ({shapes}{interp})" if shapes else f"{device}, {profile} profile"


def format_table(report: dict) -> str:
    lines = _kernel_lines(report) if report["tasks"] else []
    if report.get("e2e"):
        lines += ([""] if lines else []) + _e2e_lines(report)
    return "\n".join(lines + _side_by_side(report))


def _kernel_lines(report: dict) -> list:
    m = report["macro"]
    lines = [f"KERNEL LEVEL: {len(report['tasks'])} tasks on {_where(report)}"]
    rows = [("task", "lvl", "family", "status", "cases", "C_t", "S_t", "fast_1", "seconds")]
    for t in report["tasks"]:
        s_t = _fmt(t["S_t"], ".3f")
        if t["S_t"] is None and t.get("informational_cpu_speedup") is not None:
            s_t = f"({t['informational_cpu_speedup']:.3g} cpu)"
        rows.append((t["name"], f"L{t['level']}", t["family"], t["status"],
                     f"{t['cases_passed']}/{t['cases_total']}", _fmt(t["C_t"], ".2f"), s_t,
                     "yes" if t["fast_1"] else "no", _fmt(t.get("seconds"), ".1f")))
    lines += _table(rows)
    lines.append("families: " + "; ".join(
        f"{name} S_f={_fmt(f['S_f'])} C_f={f['C_f']:.2f} Cov_f={f['Cov_f']:.2f}" for name, f in m["families"].items()))
    lines.append(f"kernel-level MacroEval = S x C x Cov = {_fmt(m['S'])} x {m['C']:.3f} x {m['Cov']:.3f} "
                 f"= {m['MacroEval']:.3f}   (fast_1 {m['fast_1']:.2f})")
    if m.get("note"):
        lines.append(f"note: {m['note']}")
    costly = sorted(report["tasks"], key=lambda t: -(t.get("seconds") or 0))
    if costly and costly[0].get("seconds"):
        lines.append(f"cost: {sum(t.get('seconds') or 0 for t in costly):.0f} s of tests over "
                     f"{len(costly)} tasks; the most: " + ", ".join(
                         f"{t['name']} {t['seconds']:.0f} s" for t in costly[:3]))
    if report.get("phases"):
        lines.append("evaluation phases: " + ", ".join(f"{k} {v:.1f} s" for k, v in report["phases"].items()))
    impossible = [f"{t['name']}[{s['case_id']}]" for t in report["tasks"] for s in t["speed"] if s.get("ref_suspect")]
    if impossible:
        lines.append(f"not scored: the reference's time is under the roofline floor in {len(impossible)} case(s): "
                     + ", ".join(impossible[:5]))
    sides = [c.get("reference") for t in report["tasks"] for c in t["cases"] + t["speed"]]
    if "cache" in sides:
        lines.append(f"reference cache: the reference's side of {sides.count('cache')} of {len(sides)} "
                     "cases and timings came from an earlier run (--fk-no-cache: run and time it beside the candidate)")
    for t in report["tasks"]:
        if t["status"] not in ("PASSED",) and t["message"]:
            lines.append(f"{t['name']}: {t['status']}: {t['message'][:300]}")
        for cls, why in (t.get("failed_classes") or {}).items():
            lines.append(f"{t['name']}: composed class {cls} failed: {why[:200]}")
    return lines


def _speed_cell(c: dict, key: str) -> str:
    value = c.get(key)
    if value is None:
        return "-"
    return f"({value:.3g} cpu)" if c["informational"] else f"{value:.3f}"


def _mutant_cell(c: dict) -> str:
    """Mutants caught / run, and the smallest margin past the zero-credit point."""
    mutants = [m for m in (c.get("mutants") or {}).values() if m.get("d") is not None]
    if not mutants:
        return "-"
    caught = sum(1 for m in mutants if m.get("caught"))
    return f"{caught}/{len(mutants)} {c['min_mutant_margin']:+.2f}" if c.get("min_mutant_margin") is not None \
        else f"{caught}/{len(mutants)}"


def _mutant_details(c: dict) -> str:
    return "; ".join(f"{name} ({m.get('kind', 'gross')}) d={_fmt(m.get('d'))} credit={_fmt(m.get('credit'), '.2f')} "
                     f"margin={_fmt(m.get('margin'), '+.3f')}" for name, m in (c.get("mutants") or {}).items())


def _tokens_cell(c: dict) -> str:
    """Stable compared positions / target positions (the positions no noise run flips are what d
    is on): tokens for a decoder, neighbour ranks (suffixed "r") for an embedding model."""
    if not c.get("output_tokens"):
        return "-"
    unit = "" if c.get("unit", "tokens") == "tokens" else " " + c["unit"][0]
    return (f"{c['compared_tokens']}/{c['output_tokens']}" if c.get("compared_tokens") else str(c["output_tokens"])) + unit


def floor_setters(c: dict, sep: str = "/") -> str:
    """Which noise run set each path's floor ("rebatched", "reference-rounded", ...), one per path
    in the case's own order like :func:`_by_path`; empty where the report does not say."""
    runs = [(p.get("g_run") or "").split("/")[0] for p in (c.get("paths") or {}).values()]
    return sep.join(r or "-" for r in runs) if any(runs) else ""


def _by_path(c: dict, key: str) -> str:
    """One field per scoring path, "/"-separated in the case's own order: prefill/decode for a
    decoder, cosine/centred-cosine/rank for an embedding model (older reports have the deciding path's
    only)."""
    paths = c.get("paths") or {}
    if not paths:
        return _fmt(c.get(key))
    return "/".join(_fmt_small(paths[p].get(key)) for p in paths)


def _fmt_small(x) -> str:
    """``_fmt``, with a cosine discrepancy of 1e-7 kept readable instead of 0.000."""
    return f"{x:.1e}" if isinstance(x, float) and 0 < abs(x) < 1e-3 else _fmt(x)


def _e2e_lines(report: dict) -> list:
    """The end-to-end table: per (model, scenario) discrepancy, noise floor, credit, the built-in
    mutants (caught / run, smallest margin d - 0.5), speedups."""
    e2e = report.get("e2e")
    if not e2e:
        return []
    lines = [f"END TO END: {len(e2e['cases'])} (model, scenario) cases on {_where(report)}; "
             "d and g per scoring path (decoders prefill-forced/decode-forced, embedding models "
             "cosine/centred-cosine/retrieval-rank), credit the lowest against each path's pooled noise floor; mutants "
             "caught/run and the smallest margin past where each counts as caught"]
    rows = [("e2e case", "status", "tokens", "d by path", "g by path", "credit", "mutants", "thr x", "lat x", "S")]
    for c in e2e["cases"]:
        rows.append((c["case_id"], c["status"], _tokens_cell(c), _by_path(c, "d"), _by_path(c, "g"),
                     f"{c['credit']:.2f}", _mutant_cell(c), _speed_cell(c, "speedup_throughput"),
                     _speed_cell(c, "speedup_latency"), _speed_cell(c, "speedup_blended")))
    lines += _table(rows)
    m = e2e["macro"]
    lines.append("e2e families: " + "; ".join(
        f"{name} S_f={_fmt(f['S_f'])} C_f={f['C_f']:.2f} Cov_f={f['Cov_f']:.2f}" for name, f in m["families"].items()))
    lines.append(f"end-to-end MacroEval = S x C x Cov = {_fmt(m['S'])} x {m['C']:.3f} x {m['Cov']:.3f} "
                 f"= {m['MacroEval']:.3f}")
    if m.get("note"):
        lines.append(f"e2e note: {m['note']}")
    lines += [f"{c['case_id']}: {c['status']}: {c['message'][:300]}" for c in e2e["cases"]
              if c["status"] != "PASSED" and c["message"]]
    return lines


def _side_by_side(report: dict) -> list:
    """The two MacroEvals on one line, each labelled with what it measures: two scores, not one."""
    parts = []
    if report["tasks"]:
        m = report["macro"]
        what = "S x C x Cov" if m.get("speed_measured") else "C x Cov, no GPU speed"
        parts.append(f"kernel-level MacroEval {m['MacroEval']:.3f} ({what})")
    if report.get("e2e"):
        m = report["e2e"]["macro"]
        what = "S x credit x Cov" if m.get("speed_measured") else "credit x Cov, no GPU speed"
        parts.append(f"end-to-end MacroEval {m['MacroEval']:.3f} ({what})")
    return ["", " | ".join(parts) + ("   (two separate scores)" if len(parts) == 2 else "")] if parts else []


def _charts(report: dict) -> str:
    """Per task: share of cases passed and the speedup S_t (grey where the task is not valid);
    per timed case: its speedup; end to end: credit and blended speedup per case."""
    tasks = report["tasks"]
    out = []
    if tasks:
        out.append("<h2>Correctness per task (C_t)</h2>" + plots.share_chart(
            (t["name"], t["C_t"], t["status"] == "PASSED") for t in tasks))
        timed = [t for t in tasks if t["S_t"] is not None or t["speed"]]
        if timed:
            out.append("<h2>Speedup per task (S_t, log axis)</h2>" + plots.speedup_chart(
                (t["name"], t["S_t"], t["status"] == "PASSED") for t in timed))
        cases = [(f"{t['name']} {s['case_id']}", s["speedup"], t["status"] == "PASSED")
                 for t in tasks for s in t["speed"]]
        if cases:
            out.append("<h2>Speedup per timed case</h2>" + plots.speedup_chart(cases))
    e2e = (report.get("e2e") or {}).get("cases") or []
    if e2e:
        out.append("<h2>End to end: credit per case</h2>" + plots.share_chart(
            (c["case_id"], c["credit"], c["status"] == "PASSED") for c in e2e))
        out.append("<h2>End to end: blended speedup per case</h2>" + plots.speedup_chart(
            (c["case_id"], c.get("speedup_blended"), c["status"] == "PASSED" and not c.get("informational"))
            for c in e2e))
    return "\n".join(out)


# the status column (the 4th) of the task and e2e tables: green when passed, red otherwise
_VERDICT_CSS = "tr.passed td:nth-child(4){color:green}tr:not(.passed) td:nth-child(4){color:#b00}"


def write_html(report: dict, path: str | Path) -> None:
    esc = html.escape
    rows = "".join(
        f"<tr class='{esc(t['status'].lower())}'><td>{esc(t['name'])}</td><td>L{t['level']}</td>"
        f"<td>{esc(t['family'])}</td><td>{esc(t['status'])}</td>"
        f"<td>{t['cases_passed']}/{t['cases_total']}</td><td>{t['C_t']:.2f}</td>"
        f"<td>{_fmt(t['S_t'])}</td><td>{esc(t['message'][:400])}</td></tr>"
        for t in report["tasks"])
    speed_rows = "".join(
        f"<tr><td>{esc(t['name'])}</td><td>{esc(s['case_id'])}</td><td>{s['cand_us']:.2f}</td>"
        f"<td>{s['ref_us']:.2f}</td><td>{s['speedup']:.3f}</td><td>{_fmt(s['tbps'], '.2f')}</td>"
        f"<td>{_fmt(s['frac_roofline'], '.2f')}</td><td>{esc(s['mode'])}</td></tr>"
        for t in report["tasks"] for s in t["speed"])
    m = report["macro"]
    e2e = report.get("e2e") or {"cases": [], "macro": None}
    e2e_rows = "".join(
        f"<tr class='{esc(c['status'].lower())}'><td>{esc(c['case_id'])}</td><td>{esc(c['status'])}</td>"
        f"<td>{_by_path(c, 'd')}</td><td>{_by_path(c, 'g')}<br><small>{esc(floor_setters(c))}</small></td>"
        f"<td>{c['credit']:.2f}</td>"
        f"<td>{esc(_mutant_details(c))}</td>"
        f"<td>{esc(_speed_cell(c, 'speedup_throughput'))}</td><td>{esc(_speed_cell(c, 'speedup_latency'))}</td>"
        f"<td>{esc(_speed_cell(c, 'speedup_blended'))}</td><td>{esc(c['message'][:400])}</td></tr>"
        for c in e2e["cases"])
    side = esc((_side_by_side(report) or [''])[-1])
    charts = _charts(report)
    page = html_page("FastKernels report", f"""<p>MacroEval = S x C x Cov = {_fmt(m['S'])} x {m['C']:.3f} x {m['Cov']:.3f} = <b>{m['MacroEval']:.3f}</b>
{esc(m.get('note') or '')}</p>
<p><b>{side}</b></p>
<p>{esc(json.dumps(report['run']))}</p><p>{esc(json.dumps(report['environment'], default=str))}</p>
{charts}
<h2>Tasks</h2><table><tr><th>task</th><th>level</th><th>family</th><th>status</th><th>cases</th>
<th>C_t</th><th>S_t</th><th>message</th></tr>{rows}</table>
<h2>Speed</h2><table><tr><th>task</th><th>case</th><th>candidate us</th><th>reference us</th>
<th>speedup</th><th>TB/s</th><th>roofline</th><th>mode</th></tr>{speed_rows}</table>
<h2>End to end</h2><table><tr><th>case</th><th>status</th><th>d by path (prefill/decode or cosine/centred/rank)</th><th>g by path (and the noise run that set it)</th><th>credit</th><th>built-in mutants (d, credit)</th>
<th>throughput x</th><th>latency x</th><th>S</th><th>message</th></tr>{e2e_rows}</table>""", _VERDICT_CSS)
    Path(path).write_text(page)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="fk-report", description="Print the table of a FastKernels JSON report, "
                                     "or merge the reports of --fk-shard runs into one.")
    parser.add_argument("report", nargs="+",
                        help="a report written by --fk-report (or a pytest-benchmark JSON holding one); "
                             "with --merge, every shard's report")
    parser.add_argument("--merge", action="store_true",
                        help="merge the reports of shards 1/N..N/N of one run into one report")
    parser.add_argument("-o", "--output", help="with --merge: write the merged JSON report here")
    parser.add_argument("--html", help="also write an HTML page here")
    parser.add_argument("--validate", action="store_true",
                        help="check the report against report.schema.json first (exit 2 naming the bad field)")
    args = parser.parse_args(argv)
    from .merge import MergeError, merge_reports
    if len(args.report) > 1 and not args.merge:
        parser.error("several reports given: add --merge to merge the shards of one run")
    try:
        reports = [load_report(p, validate=args.validate or args.merge) for p in args.report]
        report = merge_reports(reports, args.report) if args.merge else reports[0]
    except (InvalidReport, MergeError) as exc:
        print(f"fk-report: {exc}", file=sys.stderr)
        return 2
    if args.output:
        write_json(report, args.output)
    print(format_table(report))
    if not report.get("complete", True):
        print("note: this report is incomplete (the run did not finish)")
    if args.html:
        write_html(report, args.html)
    return 0
