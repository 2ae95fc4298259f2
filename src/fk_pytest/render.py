"""What the run report and the leaderboard share: number formatting, text tables, the HTML page.

Pages are self-contained (inline CSS, inline SVG from :mod:`fk_pytest.plots`, no script, nothing
fetched), so a report can be mailed or opened from disk as it is.
"""
from __future__ import annotations

import html
from typing import Iterable, Optional, Sequence

from . import status

STYLE = """body{font-family:sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:0.5em 0}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}th{background:#f2f2f2}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.ok{background:#dcefdc}.warn{background:#fbeac0}.bad{background:#f6d3d3}.absent{background:#ececec;color:#666}
p.note{color:#555;font-size:90%}.scroll{overflow-x:auto;max-width:100%}.scroll td{white-space:nowrap}"""

LEGEND = ("green: PASSED; amber: correct with a reservation (DELEGATED, SUSPECT_SPEED); red: wrong or "
          "broken; grey: no verdict (NOT_ATTEMPTED, NOT_IMPLEMENTED, NOT_RUN, INSENSITIVE, absent)")
# How a verdict is coloured: correct, correct with a reservation, wrong, or no verdict at all.
ABSENT = (status.NOT_ATTEMPTED, status.NOT_RUN, status.INSENSITIVE, status.NOT_IMPLEMENTED)
RESERVED = (status.DELEGATED, status.SUSPECT_SPEED)


def fmt(x, spec=".3f", none="-") -> str:
    return none if x is None else format(x, spec)


def text_table(rows: Sequence[Sequence[str]]) -> list:
    """Left-aligned columns, a rule under the first row (the header)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def verdict_class(verdict: Optional[str]) -> str:
    if verdict is None or verdict in ABSENT:
        return "absent"
    if verdict == status.PASSED:
        return "ok"
    return "warn" if verdict in RESERVED else "bad"


def html_table(header: Sequence[str], rows: Iterable[Sequence], row_classes: Iterable[str] = ()) -> str:
    """A table of escaped text; a cell given as ``(text, css_class)`` gets that class."""
    esc = html.escape
    classes = list(row_classes)
    body = []
    for i, row in enumerate(rows):
        cells = "".join(f"<td class='{esc(c[1])}'>{esc(c[0])}</td>" if isinstance(c, tuple)
                        else f"<td>{esc(str(c))}</td>" for c in row)
        cls = f" class='{esc(classes[i])}'" if i < len(classes) and classes[i] else ""
        body.append(f"<tr{cls}>{cells}</tr>")
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def html_page(title: str, body: str, css: str = "") -> str:
    return (f"<!doctype html><meta charset=\"utf-8\"><title>{html.escape(title)}</title>\n"
            f"<style>{STYLE}{css}</style>\n<h1>{html.escape(title)}</h1>\n{body}")
