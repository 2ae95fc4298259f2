"""fk-leaderboard: rank candidate sets from their reports (DESIGN "MacroEval").

``fk-leaderboard A.json B.json C.json --html board.html``. Each input is a ``--fk-report`` file
(or a pytest-benchmark JSON that embeds one); each is validated against report.schema.json and a
file that is not a valid report stops the run (exit 2) with the file and the reason.

Numbers are only ranked against numbers made the same way: reports are grouped by the suite that
ran (version, commit), the device (cpu or the GPU's name), profile, mode, seed and the selection
(which tasks and end-to-end cases ran). Each group after the first says in one line how it
differs from the first. Within a group candidates rank by kernel-level MacroEval (end to end when
no kernel task ran), ties by C, then Cov; equal candidates share a rank (listed by name).

fast_p (KernelBench's measure) = share of the group's tasks that are valid and have S_t > p;
fast_0 = share valid. Without GPU timings in the group (a CPU run) fast_p for p > 0 and the
geomean speedup are not measured: shown as "-", never as 0.
"""
from __future__ import annotations

import argparse
import dataclasses
import html
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List, Optional, Sequence

from . import plots
from .macro import geomean, macro_eval
from .render import LEGEND, fmt, html_page, html_table, text_table, verdict_class
from .schema import InvalidReport, load_report

P_VALUES = (0, 1, 1.5, 2)
# What makes two reports' numbers comparable, in the order a difference is named.
GROUP_FIELDS = ("suite", "device", "profile", "mode", "seed", "selection")


@dataclasses.dataclass
class Entry:
    """One report on the board."""

    path: str
    report: dict
    label: str = ""

    @property
    def run(self) -> dict:
        return self.report["run"]

    @property
    def tasks(self) -> List[dict]:
        return self.report["tasks"]

    @property
    def e2e_cases(self) -> List[dict]:
        return (self.report.get("e2e") or {}).get("cases") or []

    def key(self) -> Dict[str, object]:
        """The grouping fields, each as a value that compares and prints."""
        suite = self.run.get("suite")
        if suite is None:
            suite_text = f"suite not recorded (report {self.report['schema_version']})"
        else:
            commit = suite["commit"][:10] if suite["commit"] else "no checkout"
            suite_text = f"{suite['name']} {suite['version']} @ {commit}" + (" (dirty)" if suite["dirty"] else "")
        env = self.report["environment"]
        return {"suite": suite_text,
                "device": (env.get("gpu") or "cuda") if self.run["device"] == "cuda" else "cpu",
                "profile": f"{self.run['profile']} profile", "mode": self.run["mode"],
                "seed": "none" if self.run["seed"] is None else str(self.run["seed"]),
                "selection": (tuple(t["name"] for t in self.tasks), tuple(c["case_id"] for c in self.e2e_cases))}


def _candidate_label(report: dict) -> str:
    cand = report["run"]["candidate"]
    if cand is None:
        return "reference"
    return f"{Path(cand['path']).name}@{cand['sha256'][:8]}"


def load_entries(paths: Sequence[str]) -> List[Entry]:
    """Every report, validated; labels made unique (the same tree run twice gets "#2")."""
    entries = [Entry(str(p), load_report(p)) for p in paths]
    seen: Dict[str, int] = {}
    for e in entries:
        base = _candidate_label(e.report) + ("" if e.report["complete"] else " (incomplete)")
        seen[base] = seen.get(base, 0) + 1
        e.label = base if seen[base] == 1 else f"{base} #{seen[base]}"
    return entries


# ---- groups ---------------------------------------------------------------------------------------
@dataclasses.dataclass
class Group:
    key: Dict[str, object]
    entries: List[Entry]
    reason: str = ""

    @property
    def timed(self) -> bool:
        """Whether any report of the group has GPU timings (then an untimed task is simply not fast)."""
        return any(not s["informational"] for e in self.entries for t in e.tasks for s in t["speed"])

    def describe(self) -> str:
        k = self.key
        return (f"{k['suite']} | {k['device']} | {k['profile']} | {k['mode']} mode | seed {k['seed']} | "
                f"{_selection_text(k['selection'])}")


def _selection_text(selection) -> str:
    tasks, cases = selection
    return _count(len(tasks), "task") + (f" + {_count(len(cases), 'e2e case')}" if cases else "")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _selection_difference(a, b) -> str:
    names_a, names_b = a[0] + a[1], b[0] + b[1]
    names = [f"+{n}" for n in names_b if n not in names_a] + [f"-{n}" for n in names_a if n not in names_b]
    shown = ", ".join(names[:4]) + (f", ... ({len(names)} in all)" if len(names) > 4 else "")
    return f"selection differs: {_selection_text(a)} vs {_selection_text(b)} ({shown})"


def difference(first: Dict[str, object], other: Dict[str, object]) -> str:
    """One line: each grouping field in which ``other`` differs from ``first``."""
    parts = []
    for f in GROUP_FIELDS:
        if first[f] != other[f]:
            parts.append(_selection_difference(first[f], other[f]) if f == "selection"
                         else f"{f} differs: {first[f]} vs {other[f]}")
    return "; ".join(parts)


def group_entries(entries: Sequence[Entry]) -> List[Group]:
    groups: List[Group] = []
    for e in entries:
        key = e.key()
        for g in groups:
            if g.key == key:
                g.entries.append(e)
                break
        else:
            groups.append(Group(key, [e]))
    n = len(entries)
    for i, g in enumerate(groups):
        g.reason = (f"all {n} reports comparable: same suite, device, profile, mode, seed and selection"
                    if len(groups) == 1 else
                    "the first group: the groups below say how they differ from it" if i == 0 else difference(groups[0].key, g.key))
    return groups


# ---- scores ---------------------------------------------------------------------------------------
def _task_views(tasks: Sequence[dict]) -> list:
    """Report tasks in the shape macro_eval reads (it was written for TaskRecord)."""
    return [SimpleNamespace(name=t["name"], family=t["family"], valid=t["valid"], speedup=t["S_t"],
                            correctness=t["C_t"], n_cases=t["cases_total"]) for t in tasks]


def fast_p(tasks: Sequence[dict], p: float, timed: bool) -> Optional[float]:
    if not tasks or (p > 0 and not timed):
        return None
    fast = [t for t in tasks if t["valid"] and (p == 0 or (t["S_t"] is not None and t["S_t"] > p))]
    return len(fast) / len(tasks)


def score(entry: Entry, timed: bool) -> dict:
    tasks = entry.tasks
    macro = entry.report["macro"] if tasks else None
    e2e = (entry.report.get("e2e") or {}).get("macro")
    return {"kernel": macro["MacroEval"] if macro else None, "e2e": e2e["MacroEval"] if e2e else None,
            "S": macro["S"] if macro else None, "C": macro["C"] if macro else (e2e or {}).get("C"),
            "Cov": macro["Cov"] if macro else (e2e or {}).get("Cov"),
            **{f"fast_{p:g}": fast_p(tasks, p, timed) for p in P_VALUES},
            "geomean": geomean([t["S_t"] for t in tasks if t["valid"]]) if timed else None}


def ranked(group: Group) -> List[tuple]:
    """(rank, entry, score), best first; equal scores share a rank."""
    scored = [(e, score(e, group.timed)) for e in group.entries]
    primary = "kernel" if group.key["selection"][0] else "e2e"

    def order(s):
        return tuple(-(s[k] or 0.0) for k in (primary, "C", "Cov"))

    scored.sort(key=lambda es: (order(es[1]), es[0].label))  # ties: by name, whatever the input order
    return [(1 + sum(order(o) < order(s) for _, o in scored), e, s) for e, s in scored]


def scope_scores(entry: Entry) -> Dict[str, dict]:
    """MacroEval, C, Cov per level ("L1".."L4"), per family, and per end-to-end family ("e2e llm")."""
    out = {}
    for level in sorted({t["level"] for t in entry.tasks}):
        out[f"L{level}"] = macro_eval(_task_views([t for t in entry.tasks if t["level"] == level]))
    for family in sorted({t["family"] for t in entry.tasks}):
        out[family] = macro_eval(_task_views([t for t in entry.tasks if t["family"] == family]))
    for family, f in ((entry.report.get("e2e") or {}).get("macro") or {"families": {}})["families"].items():
        s = f["S_f"] if f["S_f"] is not None else 1.0
        out[f"e2e {family}"] = {"MacroEval": s * f["C_f"] * f["Cov_f"], "C": f["C_f"], "Cov": f["Cov_f"]}
    return out


def matrix_cell(item: Optional[dict]) -> tuple:
    """(verdict, detail) of one task or e2e case of one report; (None, "absent") when it did not run."""
    if item is None:
        return None, "absent"
    if "case_id" in item:  # an end-to-end case
        return item["status"], f"credit {item['credit']:.2f}"
    if item["S_t"] is not None:
        return item["status"], f"{item['S_t']:.2f}x"
    return item["status"], f"{item['cases_passed']}/{item['cases_total']}" if item["cases_total"] else ""


def matrix(group: Group, order: Sequence[Entry]) -> List[tuple]:
    """Rows (task or "e2e <case>", [cell per entry in ``order``])."""
    tasks, cases = group.key["selection"]
    rows = []
    for name in tasks:
        rows.append((name, [matrix_cell(next((t for t in e.tasks if t["name"] == name), None)) for e in order]))
    for cid in cases:
        rows.append((f"e2e {cid}", [matrix_cell(next((c for c in e.e2e_cases if c["case_id"] == cid), None))
                                    for e in order]))
    return rows


# ---- text -----------------------------------------------------------------------------------------
RANK_HEADER = ("rank", "candidate", "MacroEval", "e2e MacroEval", "S", "C", "Cov",
               *(f"fast_{p:g}" for p in P_VALUES), "geomean S_t (valid)")


def _rank_row(rank: int, entry: Entry, s: dict) -> tuple:
    return (str(rank), entry.label, fmt(s["kernel"]), fmt(s["e2e"]), fmt(s["S"]), fmt(s["C"]), fmt(s["Cov"]),
            *(fmt(s[f"fast_{p:g}"], ".2f") for p in P_VALUES), fmt(s["geomean"]))


def _notes(group: Group) -> List[str]:
    notes = []
    if not group.timed:
        notes.append(f"no GPU timings in this group ({group.key['device']}): S, fast_p for p > 0 and the "
                     "geomean speedup are not measured and shown as '-', not 0; MacroEval = C x Cov")
    incomplete = [e.label for e in group.entries if not e.report["complete"]]
    if incomplete:
        notes.append(f"incomplete runs (the run did not finish): {', '.join(incomplete)}")
    return notes


def format_group(index: int, count: int, group: Group) -> str:
    board = ranked(group)
    order = [e for _, e, _ in board]
    lines = [f"== group {index} of {count} ({_count(len(group.entries), 'report')}): {group.reason}",
             f"   {group.describe()}"]
    lines += text_table([RANK_HEADER] + [_rank_row(r, e, s) for r, e, s in board])
    lines += [f"note: {n}" for n in _notes(group)]
    scopes = [scope_scores(e) for e in order]
    names = list(dict.fromkeys(k for s in scopes for k in s))
    lines += ["", "per level and family: MacroEval (C, Cov)"]
    lines += text_table([("scope", *(e.label for e in order))] + [
        (name, *(f"{s[name]['MacroEval']:.3f} ({s[name]['C']:.2f}, {s[name]['Cov']:.2f})" if name in s else "-"
                 for s in scopes)) for name in names])
    lines += ["", "task x candidate: verdict and S_t (cases passed where speed is not measured)"]
    lines += text_table([("task", *(e.label for e in order))] + [
        (name, *(f"{v or '-'} {d}".strip() for v, d in cells)) for name, cells in matrix(group, order)])
    lines += ["", "reports: " + "; ".join(f"{e.label} = {e.path}" for e in order)]
    return "\n".join(lines)


def format_board(groups: Sequence[Group]) -> str:
    n = sum(len(g.entries) for g in groups)
    head = (f"FastKernels leaderboard: {n} reports in {len(groups)} group{'s' if len(groups) > 1 else ''}; "
            "ranked by kernel-level MacroEval (S x C x Cov), ties by C then Cov")
    return "\n\n".join([head] + [format_group(i + 1, len(groups), g) for i, g in enumerate(groups)])


# ---- HTML -----------------------------------------------------------------------------------------
def _provenance_rows(order: Sequence[Entry]) -> List[tuple]:
    rows = []
    for e in order:
        run, env, cand = e.run, e.report["environment"], e.run["candidate"]
        suite = run.get("suite") or {}
        rows.append((e.label, cand["path"] if cand else "(reference scores itself)",
                     cand["sha256"][:16] if cand else "-",
                     f"{suite.get('version', '?')} @ {(suite.get('commit') or 'no checkout')[:10]}"
                     + (" dirty" if suite.get("dirty") else ""),
                     env.get("gpu") or run["device"], env.get("driver") or "-", env["torch"], env["triton"] or "-",
                     fmt(run["seed"], "d", "none"), e.path))
    return rows


def _chart(board: List[tuple]) -> str:
    items = []
    for _, e, s in board:
        if s["kernel"] is not None:
            items.append((f"{e.label} kernel", s["kernel"], plots.GOOD))
        if s["e2e"] is not None:
            items.append((f"{e.label} e2e", s["e2e"], "#3a6fb0"))
    return plots.value_chart(items)


def group_html(index: int, count: int, group: Group) -> str:
    board = ranked(group)
    order = [e for _, e, _ in board]
    scopes = [scope_scores(e) for e in order]
    names = list(dict.fromkeys(k for s in scopes for k in s))
    rank_rows = [[(c, "num") if i != 1 else c for i, c in enumerate(_rank_row(r, e, s))] for r, e, s in board]
    scope_rows = [[name] + [(f"{s[name]['MacroEval']:.3f} (C {s[name]['C']:.2f}, Cov {s[name]['Cov']:.2f})", "num")
                            if name in s else "-" for s in scopes] for name in names]
    matrix_rows = [[name] + [(f"{v or 'absent'} {d}".strip() if v else "absent", verdict_class(v))
                             for v, d in cells] for name, cells in matrix(group, order)]
    notes = "".join(f"<p class='note'>{html.escape(n)}</p>" for n in _notes(group))
    return (f"<h2>Group {index} of {count}: {html.escape(group.reason)}</h2>"
            f"<p>{html.escape(group.describe())}</p>"
            + html_table(RANK_HEADER, rank_rows) + notes
            + "<h3>MacroEval per candidate</h3>" + _chart(board)
            + "<h3>Per level and family: MacroEval (C, Cov)</h3>"
            + html_table(["scope", *(e.label for e in order)], scope_rows)
            + "<h3>Task x candidate: verdict and S_t (cases passed where speed is not measured)</h3>"
            + "<div class='scroll'>" + html_table(["task", *(e.label for e in order)], matrix_rows) + "</div>"
            + f"<p class='note'>{html.escape(LEGEND)}</p>"
            + "<h3>Where the numbers come from</h3><div class='scroll'>"
            + html_table(["candidate", "tree", "sha256", "suite", "device", "driver", "torch", "triton", "seed",
                          "report"], _provenance_rows(order)) + "</div>")


def write_html(groups: Sequence[Group], path: str | Path) -> None:
    n = sum(len(g.entries) for g in groups)
    intro = (f"<p>{n} reports in {len(groups)} group(s). Ranked by kernel-level MacroEval = S x C x Cov "
             "(end to end when no kernel task ran), ties by C, then Cov. fast_p: share of tasks valid "
             "with S_t &gt; p.</p>")
    body = intro + "".join(group_html(i + 1, len(groups), g) for i, g in enumerate(groups))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(html_page("FastKernels leaderboard", body))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="fk-leaderboard", description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", help="--fk-report files (or pytest-benchmark JSON embedding one)")
    parser.add_argument("--html", metavar="PATH", help="also write a self-contained HTML page here")
    args = parser.parse_args(argv)
    try:
        entries = load_entries(args.reports)
    except InvalidReport as exc:
        print(f"fk-leaderboard: refused: {exc}", file=sys.stderr)
        return 2
    groups = group_entries(entries)
    print(format_board(groups))
    if args.html:
        write_html(groups, args.html)
    return 0


if __name__ == "__main__":
    sys.exit(main())
