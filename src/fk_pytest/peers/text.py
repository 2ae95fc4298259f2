"""Text output: the progress line per case, the summary table for the terminal, and the markdown report."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from .contract import FRAMEWORK, PRODUCTION, REFERENCE
from .verdicts import RATIO_GEOMEAN_TARGET, RATIO_SHAPE_FLOOR


def _f(x, spec=".2f", none="-"):
    return none if x is None else format(x, spec)


def progress_line(op: str, rec: Dict[str, Any]) -> str:
    cells = []
    for name, r in rec["impls"].items():
        if r.get("us") is None:
            cells.append(f"{name} {r.get('status')}")
        else:
            cells.append(f"{name} {r['us']:.2f}us" + ("" if r.get("status") == "ok" else f" ({r.get('status')})"))
    tail = f" -> best {rec['best_peer']} ratio {rec['ratio']:.3f}" if rec.get("ratio") is not None else ""
    return f"{op} {rec['case']}: " + " | ".join(cells) + tail


def _held(h) -> str:
    return "n/a" if h is None else ("held" if h else "MISSED")


def _target_text(t: Dict[str, Any]) -> str:
    if t["held"] is None:
        return f"{t['name']}: n/a ({t['note']})"
    return (f"{t['name']}: {_held(t['held'])} (worst {t['worst_bw_frac']:.2f} at {t['worst_case']}, "
            f"{t['cases']} case{'s' if t['cases'] != 1 else ''})")


def summary_rows(doc: Dict[str, Any]) -> List[Tuple[str, ...]]:
    rows = []
    for op in doc["ops"]:
        s = op["summary"]
        low = f"{s['min_ratio']:.3f} ({s['min_ratio_case']})" if s["min_ratio"] is not None else "-"
        targets = "; ".join(_target_text(t) for t in s["targets"]) or "-"
        ratio = s["ratio_target"]
        verdict = _held(ratio["held"])
        if ratio["held"] is False and ratio.get("within_noise"):
            verdict += f" (within the +-{ratio['noise']:.0%} timing noise)"
        if ratio.get("shape_min", RATIO_SHAPE_FLOOR) != RATIO_SHAPE_FLOOR:
            verdict += f" (no shape < {ratio['shape_min']})"
        production = _kind_text(s, PRODUCTION)
        if s.get("production_target"):
            p = s["production_target"]
            production += f"; every case >= {p['case_min']}: {_held(p['held'])}"
        rows.append((op["op"], str(len(op["cases"])), _f(s["geomean_ratio"], ".3f"), low, verdict,
                     production, _kind_text(s, FRAMEWORK), targets))
    return rows


def _kind_text(summary: Dict[str, Any], kind: str) -> str:
    """'geomean (min)' of the ratio against one kind of peer; '-' where none of that kind ran."""
    k = (summary.get("by_kind") or {}).get(kind) or {}
    if k.get("geomean_ratio") is None:
        return "-"
    return f"{k['geomean_ratio']:.3f} (min {k['min_ratio']:.3f})"


def format_summary(doc: Dict[str, Any]) -> str:
    head = ("op", "cases", "geomean ratio", "min ratio (case)", "ratio target", "vs production kernels",
            "vs eager / compile", "bandwidth targets (reference)")
    rows = [head] + summary_rows(doc)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows]
    lines.insert(1, "-" * min(160, len(lines[0])))
    note = "" if doc["run"]["device"] == "cuda" else "\n(timings on the CPU are informational only)"
    return "\n".join(lines) + "\nratio = best peer time / reference time (above 1: the reference is faster)" + note


def to_markdown(doc: Dict[str, Any], command: Optional[str] = None) -> str:
    env, run = doc["environment"], doc["run"]
    roof = env.get("roofline") or {}
    lines = ["# Peer benchmark: the reference against the kernels a user could pick", ""]
    machine = env.get("gpu") or env.get("platform")
    versions = (f"torch {env.get('torch')}, triton {env.get('triton')}, "
                f"liger-kernel {env.get('liger_kernel') or 'absent'}")
    lines.append(f"{machine}, {versions}" + (f"; measured at start: copy {roof['copy_tbps']:.2f} TB/s, "
                                             f"bf16 GEMM {roof['bf16_gemm_tflops']:.0f} TFLOP/s" if roof else "") + ".")
    lines.append("")
    if command:
        lines += ["Command (repo root):", "", f"    {command}", ""]
    lines += [f"Profile `{run['profile']}`, up to {run['max_cases_per_op'] or 'all'} cases per op"
              f"{', selection `-k ' + run['keyword'] + '`' if run.get('keyword') else ''}, "
              f"{run.get('elapsed_s', '?')} s{'' if doc['complete'] else ' (INCOMPLETE run)'}. "
              "Each case: every peer checked against the float64 truth with the task's calibrated compare "
              "(a wrong peer is excluded), then all implementations timed interleaved in one loop "
              "(CUDA-graph replay where capturable, L2 flushed outside the timed window, one input set each). "
              f"**ratio = best peer time / reference time**; targets per op: geomean >= {RATIO_GEOMEAN_TARGET}, "
              f"no shape < {RATIO_SHAPE_FLOOR} (or the op's own floor, named in its row), for some ops every case "
              "at or above a floor against the production peers alone, and the bandwidth targets (fraction of the "
              "measured copy bandwidth, or of the fastest read of the case's bytes, reached by the reference).", ""]
    if run["device"] != "cuda":
        lines += ["Timings on the CPU are informational only.", ""]
    lines += ["## Summary", "", "Ratios against all peers, then apart: against production kernels (kernel libraries and "
              "serving stacks' kernels) and against eager / compiled PyTorch; each peer's kind and version are "
              "listed under its op.", "",
              "| op | cases | geomean ratio | min ratio (case) | ratio target | vs production kernels | "
              "vs eager / compile | bandwidth targets |", "|---|---|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(r) + " |" for r in summary_rows(doc)]
    for op in doc["ops"]:
        lines += ["", f"## {op['op']}", "", f"Reference `{op['reference']}`. Peers: " +
                  "; ".join(f"**{p['name']}** ({p.get('kind', '?')}, {p.get('version', '?')}): {p['description']}"
                            for p in op["peers"]) + ".", ""]
        lines += _case_table(op)
        if op["not_run"]:
            lines += ["", "Not run: " + ", ".join(f"{n['case']} ({n['reason']})" for n in op["not_run"])]
    return "\n".join(lines) + "\n"


def _case_table(op: Dict[str, Any]) -> List[str]:
    peers = [p["name"] for p in op["peers"]]
    lines = ["| case | mode | reference us | TB/s | TFLOP/s | roofline frac | copy-BW frac | " +
             " | ".join(f"{p} us" for p in peers) + " | best peer | ratio |", "|---" * (9 + len(peers)) + "|"]
    footnotes: Dict[str, int] = {}

    def mark(text: str) -> str:
        return f"[{footnotes.setdefault(text, len(footnotes) + 1)}]"

    for c in op["cases"]:
        ref = c["impls"].get(REFERENCE, {})
        cells = [c["case"] + (f" (= {', '.join(c['same_as'])})" if c.get("same_as") else ""), ref.get("mode", "-")]
        if ref.get("us") is None or ref.get("status") != "ok":
            cells[-1] = f"{ref.get('status', 'absent')} " + mark(f"reference: {ref.get('reason', c.get('error'))}")
        cells += [_f(ref.get("us")), _f(ref.get("tbps")), _f(ref.get("tflops"), ".1f"),
                  _f(ref.get("roofline_frac")), _f(ref.get("bw_frac"))]
        for p in peers:
            r = c["impls"].get(p, {"status": "absent"})
            if r.get("us") is not None and r.get("status") != "ok":  # timed, but not a record (suspect)
                why = f"{p}: {r.get('status')}: {r.get('reason', '')}"
                cells.append(f"{_f(r['us'])} {r.get('status')} {mark(why)}")
            elif r.get("us") is not None:
                cells.append(_f(r["us"]) + (" " + mark(f"{p}: {r['note']}") if r.get("note") else ""))
            else:
                why = f"{p}: {r.get('status')}: {r.get('reason', '')}"
                cells.append(f"{r.get('status')} {mark(why)}")
        cells += [c.get("best_peer") or "-", _f(c.get("ratio"), ".3f")]
        lines.append("| " + " | ".join(cells) + " |")
    if footnotes:
        lines += [""] + [f"[{n}] {text}  " for text, n in footnotes.items()]
    return lines
